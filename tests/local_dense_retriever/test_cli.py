"""retrieval_server.py: the published Search-R1 command line, our flags, the embedded default, clear failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cpu_bench.background_server import free_port
from local_dense_retriever.retrieval_server import config_from_args, main

SCRIPT = Path(__file__).resolve().parents[2] / "local_dense_retriever" / "retrieval_server.py"

PUBLISHED = ["--index_path", "e5_Flat.index", "--corpus_path", "wiki-18.jsonl", "--topk", "3",
             "--retriever_name", "e5", "--retriever_model", "intfloat/e5-base-v2"]  # fmt: skip


def test_published_command_line_parses_to_the_same_settings():
    config, _ = config_from_args([*PUBLISHED, "--faiss_gpu"])
    assert config.index_path == Path("e5_Flat.index") and config.corpus_path == Path("wiki-18.jsonl")
    assert (config.topk, config.retriever_name, config.retriever_model) == (3, "e5", "intfloat/e5-base-v2")
    assert config.faiss_gpu and config.resolved_backend() == "faiss"
    assert config.resolved_pooling() == "mean"
    assert config.host == "127.0.0.1" and config.batching


# Launch lines of other projects, as published (DESIGN §1.3): each must parse, and start where it can.
ASEARCHER = [*PUBLISHED, "--pages_path", "wiki_webpages.jsonl", "--faiss_gpu", "--port", "5005",
             "--save-address-to", "/tmp/addr"]  # fmt: skip
SKYRL = [*PUBLISHED, "--faiss_gpu", "--faiss_gpu_id", "1", "--device", "cuda:1", "--port", "8000"]
SEARCH_R1_BM25 = ["--index_path", "bm25", "--corpus_path", "wiki-18.jsonl", "--topk", "3", "--retriever_name", "bm25"]


def test_other_projects_launch_lines_parse():
    config, _ = config_from_args(ASEARCHER)  # ASearcher and RLinf (local_retrieval_server.py)
    assert config.pages_path == Path("wiki_webpages.jsonl") and config.save_address_to == Path("/tmp/addr")
    assert config.port == 5005 and config.faiss_gpu
    config, _ = config_from_args(SKYRL)  # SkyRL's retrieval_launch.sh
    assert (config.faiss_gpu_id, config.device, config.port) == (1, "cuda:1", 8000)
    config, _ = config_from_args(SEARCH_R1_BM25)
    assert config.resolved_backend() == "bm25"
    config, _ = config_from_args(
        [*PUBLISHED, "--pooling_method", "cls", "--save_address_to", "d"]
    )  # forks, our spelling
    assert config.resolved_pooling() == "cls" and config.save_address_to == Path("d")
    assert main([*PUBLISHED, "--device", "tpu"]) == 2


def test_our_flags():
    config, level = config_from_args(
        [*PUBLISHED, "--host", "0.0.0.0", "--port", "9000", "--backend", "torch", "--no_batching",
         "--max_batch_size", "128", "--max_wait_ms", "1.5", "--no_fp16", "--max_topk", "50", "--log_level", "DEBUG"]
    )  # fmt: skip
    assert (config.host, config.port, config.backend, config.batching) == ("0.0.0.0", 9000, "torch", False)
    assert (config.max_batch_size, config.max_wait_ms, config.fp16, config.max_topk) == (128, 1.5, False, 50)
    assert level == "DEBUG"
    assert config.requested_encoder_dtype() == "float32"  # --no_fp16 turns the auto half precision off
    config, _ = config_from_args([*PUBLISHED, "--encoder_dtype", "bfloat16"])
    assert config.requested_encoder_dtype() == "bfloat16"
    with pytest.raises(SystemExit):
        config_from_args([*PUBLISHED, "--encoder_dtype", "int4"])
    with pytest.raises(SystemExit):
        config_from_args([*PUBLISHED, "--index_dtype", "int8"])


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("command", "flags", "replaced_by"),
    [
        ([str(SCRIPT)], ["--encoder_dtype", "int8"], "--encoder_dtype int8 was removed (the int8 encoder): use "
         "--encoder_dtype auto"),
        ([str(SCRIPT)], ["--encoder-dtype=int8"], "--encoder_dtype int8 was removed"),
        ([str(SCRIPT)], ["--index_scan_layout", "rows_first"], "--index_scan_layout was removed: the CPU scan has one "
         "layout; drop the flag"),
        ([str(SCRIPT)], ["--no-encoder-packed"], "--no_encoder_packed was removed: the encoder runs the model's own "
         "forward"),
        (["-m", "local_dense_retriever.serve"], ["--index_scan_layout", "auto"], "--index_scan_layout was removed"),
        ([str(REPO / "local_dense_retriever" / "build_index.py")], ["--corpus_path", "c.jsonl", "--output", "x.npy",
         "--no_encoder_packed"], "--no_encoder_packed was removed"),
    ],
)  # fmt: skip
def test_a_removed_flag_is_refused_in_one_line_naming_what_replaced_it(command, flags, replaced_by):
    out = subprocess.run([sys.executable, *command, *PUBLISHED[:4], *flags], capture_output=True, text=True,
                         cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert ": error: " in line and replaced_by in line


def test_backend_auto_follows_the_index_kind(tmp_path):
    import faiss
    import numpy as np

    flat, hnsw = tmp_path / "flat.index", tmp_path / "hnsw.index"
    faiss.write_index(faiss.IndexFlatIP(4), str(flat))
    h = faiss.IndexHNSWFlat(4, 4, faiss.METRIC_INNER_PRODUCT)
    h.add(np.eye(4, dtype="float32"))
    faiss.write_index(h, str(hnsw))
    assert config_from_args(["--index_path", str(flat), "--corpus_path", "c"])[0].resolved_backend() == "torch"
    assert config_from_args(["--index_path", str(hnsw), "--corpus_path", "c"])[0].resolved_backend() == "faiss"
    assert config_from_args(["--corpus_path", "c", "--retriever_name", "bm25"])[0].resolved_backend() == "bm25"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--topk", "0"], "topk"),
        ([*PUBLISHED, "--topk", "500"], "exceeds max_topk"),
        (["--index_path", "x.index"], "give both --index_path and --corpus_path"),
        (["--max_batch_size", "0"], "max_batch_size"),
    ],
)
def test_bad_settings_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retrieval_server: error:") and message in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--index_path", "{flat}", "--nprobe", "8"], "--nprobe tunes a compressed faiss index (nprobe: IVF, "
         "ef_search: HNSW), but {flat} is a flat index, searched exactly: drop it, or give --cpu_index"),
        (["--index_path", "{flat}", "--backend", "faiss", "--ef_search", "8"], "--ef_search tunes a compressed faiss"),
        (["--index_path", "{npy}", "--ef_search", "8"], "{npy} is a flat index"),
        (["--retriever_name", "bm25", "--nprobe", "4"], "--nprobe tunes a faiss index; the bm25 backend has none"),
        (["--index_path", "{flat}", "--nprobe", "0"], "nprobe: Input should be greater than or equal to 1"),
        (["--index_path", "{flat}", "--cpu_index", "{missing}"], "--cpu_index {missing}: no such index file"),
        (["--index_path", "{ivf}", "--cpu_index", "auto"], "--cpu_index is the CPU fallback of a flat index on GPUs; "
         "--index_path {ivf} is served by the faiss backend as it is"),
        (["--retriever_name", "bm25", "--cpu_index", "auto"], "--cpu_index is the CPU fallback of a flat index"),
        (["--index_path", "{flat}", "--gpu_memory_fraction", "1.5"], "gpu_memory_fraction: Input should be less"),
        (["--index_path", "{flat}", "--gpu_memory_fraction", "0"], "gpu_memory_fraction: Input should be greater"),
    ],
)  # fmt: skip
def test_a_search_knob_or_fallback_that_cannot_apply_exits_2(tmp_path, capsys, argv, message):
    import faiss
    import numpy as np

    files = {"flat": tmp_path / "flat.index", "npy": tmp_path / "e.npy", "ivf": tmp_path / "ivf.index",
             "missing": tmp_path / "none.index"}  # fmt: skip
    faiss.write_index(faiss.IndexFlatIP(4), str(files["flat"]))
    np.save(files["npy"], np.eye(4, dtype=np.float32))
    ivf = faiss.index_factory(4, "IVF1,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(np.eye(4, dtype=np.float32))
    faiss.write_index(ivf, str(files["ivf"]))
    argv = [a.format(**files) for a in argv] + ["--corpus_path", "c.jsonl"]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("retrieval_server: error:") and message.format(**files) in line


def test_unknown_choice_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--backend", "elasticsearch"])
    assert exc.value.code == 2


def _start(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--port", str(port), "--num_threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("server never became ready")


def _stop(proc: subprocess.Popen, sig: int = signal.SIGINT) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_published_command_serves_a_faiss_flat_index(minilm_index, toy_dataset, minilm_path, toy_questions):
    index, corpus = str(minilm_index["faiss"]), str(toy_dataset.corpus_path)
    proc, url = _start(["--index_path", index, "--corpus_path", corpus, "--topk", "3",
                        "--retriever_name", "minilm", "--retriever_model", str(minilm_path)])  # fmt: skip
    try:
        _wait_ready(proc, url)
        q = next(q for q in toy_questions if q["metadata"]["hops"] == 1)
        r = httpx.post(f"{url}/retrieve", json={"queries": [q["question"]], "topk": 3, "return_scores": False})
        assert r.status_code == 200
        assert set(q["metadata"]["supporting_ids"]) & {d["id"] for d in r.json()["result"][0]}
    finally:
        out = _stop(proc)
    assert "loaded encoder in" in out and "loaded torch index in" in out and "ready:" in out


def test_an_ivf_index_is_served_at_the_nprobe_asked(tmp_path, minilm_index, toy_dataset, minilm_path, toy_questions,
                                                    start_cli_server):  # fmt: skip
    """The real CLI with a compressed index and --nprobe: /health ``index`` and the load log say what is served."""
    import faiss
    import numpy as np

    vectors = np.load(minilm_index["npy"])
    ivf = faiss.index_factory(vectors.shape[1], "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.add(vectors)
    faiss.write_index(ivf, str(tmp_path / "minilm_ivf.index"))
    args = ["--index_path", str(tmp_path / "minilm_ivf.index"), "--corpus_path", str(toy_dataset.corpus_path),
            "--retriever_name", "minilm", "--retriever_model", str(minilm_path), "--nprobe", "4"]  # fmt: skip
    proc, url = start_cli_server(args, tmp_path / "server.log")
    try:
        health = httpx.get(f"{url}/health").json()
        q = next(q for q in toy_questions if q["metadata"]["hops"] == 1)
        r = httpx.post(f"{url}/retrieve", json={"queries": [q["question"]], "topk": 3, "return_scores": False})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert health["index"]["search_param"] == "nprobe" and health["index"]["search_value"] == 4
    assert health["index"]["type"] == "IndexIVFFlat" and health["index"]["recall_note"] == "no build record"
    assert "faiss IndexIVFFlat (nprobe 4, no build record), 300 x 384 on cpu" in health["detail"]
    assert set(q["metadata"]["supporting_ids"]) & {d["id"] for d in r.json()["result"][0]}
    log = (tmp_path / "server.log").read_text()
    assert "index: IndexIVFFlat, nprobe 4; no build record;" in log


def test_missing_index_exits_1_with_the_cause(toy_dataset, tmp_path, minilm_path):
    proc, _ = _start(["--index_path", str(tmp_path / "e5_Flat.index"), "--corpus_path", str(toy_dataset.corpus_path),
                      "--retriever_name", "minilm", "--retriever_model", str(minilm_path)])  # fmt: skip
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1
    assert (
        out.strip().splitlines()[-1] == f"retrieval_server: error: index file not found: {tmp_path / 'e5_Flat.index'}"
    )


def test_no_arguments_serves_the_embedded_default_and_caches_it(tmp_path):
    env = {"VERL_SEARCH_CACHE": str(tmp_path)}
    proc, url = _start(["--toy_passages", "60"], env)
    try:
        _wait_ready(proc, url)
        r = httpx.post(f"{url}/retrieve", json={"queries": ["Who founded it?"], "topk": 2, "return_scores": True})
        assert len(r.json()["result"][0]) == 2
    finally:
        first = _stop(proc)
    assert "building the embedded default index" in first
    assert (tmp_path / "toy-60" / "minilm_flat.npy").is_file()
    proc, url = _start(["--toy_passages", "60"], env)
    try:
        _wait_ready(proc, url)
    finally:
        second = _stop(proc)
    assert "building the embedded default index" not in second and "loaded embedded default in" in second


def test_asearcher_launch_line_serves_urls_pages_and_its_address(tmp_path, minilm_index, toy_dataset, minilm_path):
    """ASearcher/RLinf: --pages_path, --save-address-to and --faiss_gpu on a machine without a GPU (start anyway, say
    what we do instead); /access answers pages; SIGTERM drains and exits 0."""
    import json

    pages = tmp_path / "wiki_webpages.jsonl"
    pages.write_text(json.dumps({"url": "https://en.wikipedia.org/w/index.php?title=X", "contents": "page X"}) + "\n")
    addr = tmp_path / "addr" / "servers"
    proc, url = _start(["--index_path", str(minilm_index["faiss"]), "--corpus_path", str(toy_dataset.corpus_path),
                        "--pages_path", str(pages), "--topk", "3", "--retriever_name", "minilm",
                        "--retriever_model", str(minilm_path), "--faiss_gpu",
                        "--save-address-to", str(addr)])  # fmt: skip
    try:
        _wait_ready(proc, url)
        port = url.rsplit(":", 1)[1]
        deadline = time.monotonic() + 30
        while not list(addr.glob("*.txt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.name for p in addr.iterdir()] == [f"Host127.0.0.1_IP{port}.txt"]
        assert (addr / f"Host127.0.0.1_IP{port}.txt").read_text() == f"127.0.0.1:{port}"
        r = httpx.post(f"{url}/access", json={"urls": ["https://en.wikipedia.org/w/index.php/X", "nope"]})
        assert r.json()["result"] == [
            {"url": "https://en.wikipedia.org/w/index.php?title=X", "contents": "page X"},
            None,
        ]
        assert len(httpx.post(f"{url}/retrieve", json={"query": "Who founded it?"}).json()["result"]) == 1
    finally:
        out = _stop(proc, signal.SIGTERM)  # asserts exit status 0 after the drain
    assert "--faiss_gpu: no CUDA GPU is visible here; serving the index on the CPU instead" in out


def test_connections_reply_without_waiting_on_delayed_acks():
    """Accepted connections inherit TCP_NODELAY from the server's socket (without it every reply waited ~45 ms)."""
    import socket

    from local_dense_retriever.retrieval_server import listening_socket

    server = listening_socket("127.0.0.1", 0)
    try:
        server.listen()
        with socket.create_connection(server.getsockname()[:2]):
            conn, _ = server.accept()
            with conn:
                assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        server.close()


def test_help_shows_descriptions_and_defaults_that_hold_a_percent_sign(capsys):
    """argparse %-formats help text: a field described with "5%" (or a default like "90%") must print, not crash."""
    import argparse

    from pydantic import BaseModel, Field

    from local_dense_retriever.retrieval_server import add_model_flags

    class Knobs(BaseModel):
        share: float = Field(default=0.05, description="at most 5% of the last batch's time")
        label: str = Field(default="90%", description="a label")

    p = argparse.ArgumentParser()
    add_model_flags(p, Knobs)
    p.print_help()
    out = capsys.readouterr().out
    assert "at most 5% of the last batch's time" in out and "(default: 90%)" in out
