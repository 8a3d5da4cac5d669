"""The preflight weighs the GPU memory a retriever reports in ``/health`` against the rollout's share of each GPU it
shares with training. The retriever here is a real HTTP server on 127.0.0.1 answering ``/health`` as a GPU server
would (the one seam: no GPU exists on this machine)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verl_search.launch.checks import LaunchContext
from verl_search.launch.preflight import run_check
from verl_search.launch.run_inputs import check_retriever_gpus
from verl_search.launch.trainer_config import compose_launch_config

GIB = 1024**3
H100 = 80 * GIB


def gpu(i: int, held_gib: float, *, process: bool = True) -> dict:
    held = int(held_gib * GIB)
    return {"index": i, "uuid": f"GPU-{i:04d}", "name": "NVIDIA H100", "total_bytes": H100,
            "reserved_bytes": held, "process_bytes": held if process else None}  # fmt: skip


@pytest.fixture
def retriever():
    """A /health server; set ``.health`` to the body it answers."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps(server.health).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.health = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    yield server
    server.shutdown()


class Environment:
    """The training's GPUs (None: none seen here, as on this machine)."""

    def __init__(self, uuids: set[str] | None) -> None:
        self.uuids = uuids

    def gpu_uuids(self) -> set[str] | None:
        return self.uuids


def check(retriever, gpus, *, training=None, fraction=0.5, dry_run=False):
    retriever.health = {"status": "ok", "gpus": gpus} if gpus is not None else {"status": "ok"}
    config = compose_launch_config([f"actor_rollout_ref.rollout.gpu_memory_utilization={fraction}"]).config
    ctx = LaunchContext(config, dry_run=dry_run)
    ctx.environment = Environment(training)
    return run_check("retriever gpus", lambda: check_retriever_gpus(ctx, retriever.url))


def test_an_index_spread_over_every_gpu_leaves_the_actor_room(retriever):
    result = check(retriever, [gpu(i, 5.0) for i in range(8)], training={f"{i:04d}" for i in range(8)})
    assert result.level == "ok"
    assert "holds up to 5.0 GiB of 80.0 GiB on 8 GPU(s) training also uses" in result.message
    assert "the actor keeps 35.0 GiB beside the rollout's 0.5" in result.message


def test_the_whole_index_on_one_training_gpu_stops_the_launch_naming_the_fixes(retriever):
    result = check(retriever, [gpu(0, 31.3)], training={"0000", "0001"})
    assert result.level == "error"
    assert "the FSDP rank keeps 8.7 GiB of the 40.0 GiB left" in result.message
    for fix in ("GPUS=all", "GPUS=6,7", "GPU_MEMORY_UTILIZATION"):
        assert fix in result.message
    assert check(retriever, [gpu(0, 31.3)], training={"0000"}, dry_run=True).level == "warning"


def test_a_quarter_of_what_the_rollout_leaves_is_a_warning_and_reserved_bytes_count_without_nvml(retriever):
    assert check(retriever, [gpu(0, 12.0, process=False)], training={"0000"}).level == "warning"
    assert check(retriever, [gpu(0, 12.0)], training={"0000"}, fraction=0.3).level == "ok"  # 56 GiB left


def test_a_fleet_s_replicas_on_one_gpu_are_added_up(retriever):
    result = check(retriever, [gpu(0, 12.0), gpu(0, 12.0)], training={"0000"})
    assert result.level == "error" and "up to 24.0 GiB" in result.message


def test_gpus_of_its_own_or_none_at_all_are_fine(retriever):
    own = check(retriever, [gpu(7, 31.3)], training={f"{i:04d}" for i in range(7)})
    assert own.level == "ok" and "(not a training GPU)" in own.message
    assert check(retriever, []).message.endswith("holds no GPU memory")
    assert "does not report its GPU memory" in check(retriever, None).message


def test_without_a_visible_gpu_every_retriever_gpu_is_assumed_shared(retriever):
    result = check(retriever, [gpu(0, 31.3)], training=None, dry_run=True)
    assert result.level == "warning" and "(assumed: no GPU seen here)" in result.message
