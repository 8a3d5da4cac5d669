"""Wall-clock and trajectories/s of the search recipe in each trainer mode (TRAINER=sync|one_step_off|fully_async) on
verl's real trainer on this CPU (tiny Qwen2, hf_cpu rollout, the real retriever), with the retriever answering at its
own speed and behind a proxy that adds latency to every /retrieve (the regime of web search or a loaded wiki-18
server); plus the held-out reward after the same number of samples (validation at the last step).

    python benchmarks/async_trainers.py [--trainers sync one_step_off fully_async] [--steps 6] [--latency-ms 0 200]

Prints one JSON line per (trainer, latency). Invariant: one run at a time, each in its own process group that ends
with it; the retriever and the proxy end with the script. On a CPU the rollout and the trainer share the same cores,
so the overlap the async modes buy on GPUs (separate devices) shows here only where a run waits on something else
(the added search latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cpu_trainer import FORCED, prepare  # benchmarks/ is the script's folder

REPO = Path(__file__).resolve().parents[1]
BATCH, ROLLOUT_N = 4, 2
OFF_POLICY = "training/off_policy"


class SlowProxy(threading.Thread):
    """An HTTP proxy on 127.0.0.1 that forwards every request to ``target`` after ``latency_s`` (aiohttp)."""

    def __init__(self, target: str, latency_s: float) -> None:
        super().__init__(daemon=True)
        self.target, self.latency_s = target.rstrip("/"), latency_s
        self.ready, self.port = threading.Event(), 0

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            await asyncio.sleep(self.latency_s)
            body = await request.read()
            async with session.request(request.method, f"{self.target}{request.path}", data=body,
                                       headers={"Content-Type": "application/json"}) as reply:  # fmt: skip
                return web.Response(body=await reply.read(), status=reply.status, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        await asyncio.Event().wait()


def run(root: Path, env: dict[str, str], trainer: str, steps: int, retriever_url: str, tag: str) -> dict:
    run_dir = root / f"run-{trainer}-{tag}"
    metrics_path = run_dir / "metrics.jsonl"
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update({k: v for k, v in env.items() if not k.startswith("_")})
    full.update(
        PYTHON=sys.executable, RUN_DIR=str(run_dir), TOTAL_STEPS=str(steps), TOTAL_EPOCHS="100", TEST_FREQ=str(steps),
        TRAINER=trainer, RETRIEVER_URL=retriever_url, TRAIN_BATCH_SIZE=str(BATCH), PPO_MINI_BATCH_SIZE=str(BATCH),
        ROLLOUT_N=str(ROLLOUT_N), VERL_FILE_LOGGER_PATH=str(metrics_path), LOGGER='["console","file"]',
    )  # fmt: skip
    start = time.monotonic()
    script = REPO / "run_scripts" / "run_tiny_search_cpu.sh"
    options = f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{{FORCED}}}"
    log_path = root / f"{run_dir.name}.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        ["bash", str(script), options], env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    first_step_at = None
    try:
        while process.poll() is None:
            if first_step_at is None and metrics_path.exists() and metrics_path.read_text().strip():
                first_step_at = time.monotonic() - start
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
    wall = time.monotonic() - start
    if process.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"TRAINER={trainer} ({tag}) exited with {process.returncode}:\n{tail}")
    rows = {r["step"]: r["data"] for r in map(json.loads, metrics_path.read_text().splitlines())}
    after_first = wall - (first_step_at or 0.0)
    val = {k: v for k, v in rows[max(rows)].items() if k.startswith("val-core/") and "reward/mean" in k}
    return {
        "trainer": trainer,
        "retriever": tag,
        "steps": len(rows),
        "wall_s": wall,
        "startup_to_first_step_s": first_step_at,
        # trajectories trained after step 1 (start-up excluded), per second of wall-clock
        "trajectories_per_s": (len(rows) - 1) * BATCH * ROLLOUT_N / after_first if len(rows) > 1 else None,
        "step_s_mean": sum(r["timing_s/step"] for r in rows.values()) / len(rows),
        "gen_wait_s_mean": sum(r.get("timing_s/gen", 0.0) for r in rows.values()) / len(rows),
        "staleness_worst_max": max(r.get(f"{OFF_POLICY}/trajectory_staleness_worst/max", 0) for r in rows.values()),
        "heldout_reward": val,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainers", nargs="+", default=["sync", "one_step_off", "fully_async"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 200.0])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="async-trainers-bench-") as tmp:
        env = prepare(Path(tmp))
        try:
            direct = env["RETRIEVER_URL"]
            for latency in args.latency_ms:
                url, tag = direct, "fast"
                if latency > 0:
                    proxy = SlowProxy(direct.rsplit("/", 1)[0], latency / 1000)
                    proxy.start()
                    proxy.ready.wait(30)
                    url, tag = f"http://127.0.0.1:{proxy.port}/retrieve", f"+{latency:g}ms"
                for trainer in args.trainers:
                    result = run(Path(tmp), env, trainer, args.steps, url, tag)
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
        finally:
            os.kill(int(env["_retriever_pid"]), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
