"""Starting the Serve fleet wrongly fails at once with a one-line cause (no Ray cluster needed for any of these)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpu_bench.background_server import free_port
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.serve.errors import ShardingError
from local_dense_retriever.serve.options import ServeOptions
from local_dense_retriever.serve.shards import check_shardable, shard_bounds

REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "local_dense_retriever.serve"]


def run_cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code, *args] if code else [*CLI, *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_shards_are_contiguous_and_cover_every_row():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 2) == [(0, 1), (1, 2)]


def test_more_shards_than_passages_is_refused(tmp_path):
    np.save(tmp_path / "v.npy", np.ones((3, 4), dtype=np.float32))
    (tmp_path / "c.jsonl").write_text("")
    config = ServerConfig(index_path=tmp_path / "v.npy", corpus_path=tmp_path / "c.jsonl")
    with pytest.raises(ShardingError, match="4 shards for an index of 3 passages: use at most 3 shards"):
        check_shardable(config, 4)
    assert check_shardable(config, 3) == 3


def test_only_flat_dense_indexes_can_be_sharded(tmp_path):
    import faiss

    index = faiss.IndexHNSWFlat(4, 8)
    index.add(np.eye(4, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "hnsw.index"))
    (tmp_path / "c.jsonl").write_text("")
    hnsw = ServerConfig(index_path=tmp_path / "hnsw.index", corpus_path=tmp_path / "c.jsonl")
    with pytest.raises(ShardingError, match="not a flat inner-product index"):
        check_shardable(hnsw, 2)
    bm25 = ServerConfig(retriever_name="bm25", corpus_path=tmp_path / "c.jsonl")
    with pytest.raises(ShardingError, match="bm25 indexes cannot be sharded"):
        check_shardable(bm25, 2)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"min_replicas": 1}, "give both --min_replicas and --max_replicas"),
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas=3 exceeds max_replicas=2"),
        ({"detach": True}, "--detach needs --address"),
    ],
)
def test_inconsistent_fleet_options_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ServeOptions(**fields)


def test_autoscaling_bounds_become_serves_autoscaling_config():
    scaling = ServeOptions(min_replicas=0, max_replicas=4, target_ongoing_requests=32).scaling()
    assert scaling == {"autoscaling_config": {"min_replicas": 0, "max_replicas": 4, "initial_replicas": 1,
                                              "target_ongoing_requests": 32.0}}  # fmt: skip
    assert ServeOptions(num_replicas=3).scaling() == {"num_replicas": 3}


def test_cli_bad_flag_value_exits_2_with_one_line():
    result = run_cli("--num_replicas", "0")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m local_dense_retriever.serve: error: num_replicas")


def test_cli_unreachable_ray_fails_fast_with_the_cause():
    result = run_cli("--address", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert "no Ray cluster answers at 127.0.0.1:" in result.stderr and "ray start --head" in result.stderr


def test_cli_without_the_serve_extra_says_how_to_install_it():
    block = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'ray.serve' or name.startswith('ray.serve.'):\n"
        "            raise ImportError(\"No module named 'ray.serve'\")\n"
        "sys.meta_path.insert(0, Block())\n"
        "from local_dense_retriever.serve.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = run_cli("--shards", "2", code=block)
    assert result.returncode == 1
    assert "Ray Serve is not installed" in result.stderr and "pip install 'verl-search[serve]'" in result.stderr


def test_the_private_serve_api_the_fleet_uses_is_what_the_pinned_ray_has(monkeypatch):
    """serve._run (a deadline of our own) and the running proxy's address have no public twin: checked by name and
    arguments, so a Ray upgrade that changes them fails with one line naming the fix."""
    serve = pytest.importorskip("ray.serve")
    from local_dense_retriever.serve.errors import ServeSetupError
    from local_dense_retriever.serve.fleet import private_serve_api

    run, proxy_address = private_serve_api(serve)
    assert run is serve._run and callable(proxy_address)

    def reshaped(app, *, blocking=True, name="default"):  # what a renamed keyword would look like
        pass

    monkeypatch.setattr(serve, "_run", reshaped)
    with pytest.raises(ServeSetupError, match=r"changed the private Serve API the fleet uses \(missing _blocking, "):
        private_serve_api(serve)
    monkeypatch.delattr(serve, "_run")
    with pytest.raises(ServeSetupError, match="lacks a private Serve API the fleet uses"):
        private_serve_api(serve)
