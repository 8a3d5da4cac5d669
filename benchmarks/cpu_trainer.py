"""verl's real GRPO trainer on this CPU (tiny Qwen2, the search tool, the real retriever): a step's time and split,
and the trainer modes side by side.

    python benchmarks/cpu_trainer.py [--ranks 1 2] [--steps 3] [--legacy]
    python benchmarks/cpu_trainer.py --trainers sync one_step_off fully_async --steps 6 --latency_ms 0 200

Every run is ``run_scripts/run_tiny_search_cpu.sh`` (``python -m verl.trainer.main_ppo``, the hf_cpu rollout) on a
tiny random Qwen2 with the test kit's forced openings (a random model searches and answers), rows alternating
``tool_agent`` and ``search_r1_agent``, against the embedded toy retriever.

Without ``--trainers``, per rank count: start-up to the end of step 1, seconds per step (mean of the steps after the
first) and its split (generation, old log-probs, reference, actor update, weight sync), and the peak resident memory
summed over every process of the run; ``--legacy`` runs verl's legacy RayPPOTrainer, which also logs the agent
loop's per-trajectory generation and tool-call time: the share of rollout time spent waiting on search.

With ``--trainers``: wall-clock and trajectories/s per trainer mode (``TRAINER=``, see ``run_scripts/common.sh``), with
the retriever answering at its own speed and behind a proxy that adds ``--latency_ms`` to every /retrieve (the regime
of web search or a loaded wiki-18 server), plus the held-out reward after the same number of samples (validation at
the last step). On a CPU the rollout and the trainer share the same cores, so the overlap the asynchronous modes buy
on GPUs (separate devices) shows only where a run waits on something else (the added latency).

Prints one JSON line per run. Invariant: one run at a time, each in its own process group that ends with it; the
retriever and the proxy end with the script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import REPO, free_port, wait_until_healthy  # noqa: E402

SPLIT = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/update_weights"]
#: per-trajectory agent-loop times (mean over the batch's trajectories); only verl's legacy trainer logs them
AGENT_LOOP = ["timing_s/agent_loop/generate_sequences/mean", "timing_s/agent_loop/tool_calls/mean"]
#: the test kit's opening policy (cpu_bench.testing.forced_prefix): a random model searches and answers
FORCED = (
    "opening_policy:{path:cpu_bench.testing.forced_prefix.ForcedOpenings,search_every:2,answer:Paris,answer_every:1},"
    "max_tokens_per_turn:48"
)
#: the trainer modes' batch: prompts per step and samples per prompt
BATCH, ROLLOUT_N = 4, 2
OFF_POLICY = "training/off_policy"


class RssSampler(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants (Ray's workers included), sampled every 0.5 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.peak_processes, self.stopped = pid, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                root = psutil.Process(self.pid)
                family = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for process in family:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            if total > self.peak:
                self.peak, self.peak_processes = total, len(family)


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


def prepare(root: Path) -> dict[str, str]:
    """A tiny model, the real retriever (embedded toy default) and mixed tool_agent/search_r1_agent data: the
    environment of ``run_tiny_search_cpu.sh`` (keys starting with ``_`` are this script's own)."""
    model = root / "tiny"
    subprocess.run([sys.executable, "-m", "cpu_bench.train.tiny_model", "--out", str(model)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "local_dense_retriever" / "retrieval_server.py"), "--port", str(port)]
        + ["--toy_passages", "200"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until_healthy(f"http://127.0.0.1:{port}", server, timeout=300, what="retriever")
    data = root / "data"
    for template in ("tool_call", "search_r1"):
        qa = root / "qa.jsonl"
        rows = [{"question": f"what is the capital of france ({i})", "golden_answers": ["Paris"]} for i in range(16)]
        qa.write_text("".join(json.dumps({**r, "data_source": "nq"}) + "\n" for r in rows))
        subprocess.run(
            [sys.executable, str(REPO / "data_preprocess" / "preprocess_searchR1_dataset.py"), "--input_jsonl"]
            + [str(qa), "--splits", "train", "test", "--val_per_source", "2", "--template", template]
            + ["--local_dir", str(data / template), "--no_progress"],
            check=True,
            capture_output=True,
        )
    import pandas as pd
    import yaml

    (data / "mixed").mkdir()
    for split in ("train", "val_subset"):
        a, b = (pd.read_parquet(data / t / f"{split}.parquet") for t in ("tool_call", "search_r1"))
        pd.concat([f.iloc[[i]] for i in range(min(len(a), len(b))) for f in (a, b)], ignore_index=True).to_parquet(
            data / "mixed" / f"{split}.parquet"
        )
    tools = root / "tools.yaml"
    config = yaml.safe_load((REPO / "tool_config" / "search_tool_config.yaml").read_text())
    config["tools"][0]["config"].update(topk=1, max_result_chars=800)
    tools.write_text(yaml.safe_dump(config))
    return {
        "MODEL_PATH": str(model),
        "DATA_DIR": str(data / "mixed"),
        "TOOL_CONFIG": str(tools),
        "RETRIEVER_URL": f"http://127.0.0.1:{port}/retrieve",
        "MAX_TOOL_RESPONSE_LENGTH": "800",
        "AGENT_CHECK": "0",
        "SKIP_PREFLIGHT": "1",
        "_retriever_pid": str(server.pid),
    }


def run(root: Path, env: dict[str, str], steps: int, *, ranks: int | None = None, legacy: bool = False,
        trainer: str | None = None, retriever_url: str | None = None, tag: str = "") -> dict:  # fmt: skip
    """One run of the launch script; its metrics, read from verl's file logger. ``trainer``: a trainer-mode run
    (its batch, validation at the last step, ``retriever_url``); else a split run on ``ranks`` ranks."""
    name = f"run-{trainer or ranks}{'-legacy' if legacy else ''}{f'-{tag}' if tag else ''}"
    run_dir = root / name
    metrics_path = run_dir / "metrics.jsonl"
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update({k: v for k, v in env.items() if not k.startswith("_")})
    full.update(PYTHON=sys.executable, RUN_DIR=str(run_dir), TOTAL_STEPS=str(steps),
                VERL_FILE_LOGGER_PATH=str(metrics_path), LOGGER='["console","file"]')  # fmt: skip
    if trainer:
        full.update(TRAINER=trainer, RETRIEVER_URL=retriever_url or env["RETRIEVER_URL"], TOTAL_EPOCHS="100",
                    TEST_FREQ=str(steps), TRAIN_BATCH_SIZE=str(BATCH), PPO_MINI_BATCH_SIZE=str(BATCH),
                    ROLLOUT_N=str(ROLLOUT_N))  # fmt: skip
    else:
        full.update(N_RANKS=str(ranks))
    options = [f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{{FORCED}}}"]
    if legacy:
        options.append("trainer.use_v1=False")
    log_path = root / f"{name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            ["bash", str(REPO / "run_scripts" / "run_tiny_search_cpu.sh"), *options],
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = RssSampler(process.pid)
        sampler.start()
        first_step_at = None
        try:
            while process.poll() is None:
                if first_step_at is None and metrics_path.exists() and metrics_path.read_text().strip():
                    first_step_at = time.monotonic() - start
                time.sleep(0.5)
        finally:
            sampler.stopped.set()
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    wall = time.monotonic() - start
    if process.returncode != 0:
        raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
    by_step = {r["step"]: r["data"] for r in map(json.loads, metrics_path.read_text().splitlines())}
    rows = [by_step[s] for s in sorted(by_step)]
    later = rows[1:] or rows  # step 1 includes warm-up
    out = {
        "trainer": trainer or ("legacy RayPPOTrainer" if legacy else "v1"),
        "ranks": ranks,
        "retriever": tag or "fast",
        "steps": len(rows),
        "wall_s": wall,
        "startup_to_first_step_s": first_step_at,
        "step_s": statistics.mean(r["timing_s/step"] for r in later),
        **{key: statistics.mean(r.get(key, 0.0) for r in later) for key in SPLIT},
        **{key: statistics.mean(r[key] for r in later) for key in AGENT_LOOP if all(key in r for r in later)},
        "peak_rss_gb": sampler.peak / 2**30,
        "processes_at_peak": sampler.peak_processes,
    }
    if trainer:
        after_first = wall - (first_step_at or 0.0)
        out.update(
            # trajectories trained after step 1 (start-up excluded), per second of wall-clock
            trajectories_per_s=(len(rows) - 1) * BATCH * ROLLOUT_N / after_first if len(rows) > 1 else None,
            step_s_mean=statistics.mean(r["timing_s/step"] for r in rows),
            gen_wait_s_mean=statistics.mean(r.get("timing_s/gen", 0.0) for r in rows),
            staleness_worst_max=max(r.get(f"{OFF_POLICY}/trajectory_staleness_worst/max", 0) for r in rows),
            heldout_reward={k: v for k, v in rows[-1].items() if k.startswith("val-core/") and "reward/mean" in k},
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="split runs: ranks of each run")
    parser.add_argument("--steps", type=int, help="GRPO steps per run (default 3; with --trainers 6)")
    parser.add_argument(
        "--legacy", action="store_true", help="verl's legacy RayPPOTrainer (trainer.use_v1=False): adds tool-call time"
    )
    parser.add_argument("--trainers", nargs="+", help="trainer modes to compare, e.g. sync one_step_off fully_async")
    parser.add_argument("--latency_ms", type=float, nargs="+", default=[0.0, 200.0],
                        help="with --trainers: latency added to every /retrieve, one set of runs each")  # fmt: skip
    args = parser.parse_args(argv)
    steps = args.steps or (6 if args.trainers else 3)
    with tempfile.TemporaryDirectory(prefix="cpu-trainer-bench-") as tmp:
        root = Path(tmp)
        env = prepare(root)
        try:
            if not args.trainers:
                for ranks in args.ranks:
                    result = run(root, env, steps, ranks=ranks, legacy=args.legacy)
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
                return 0
            direct = env["RETRIEVER_URL"]
            for latency in args.latency_ms:
                url, tag = direct, ""
                if latency > 0:
                    proxy = SlowProxy(direct.rsplit("/", 1)[0], latency / 1000)
                    proxy.start()
                    proxy.ready.wait(30)
                    url, tag = f"http://127.0.0.1:{proxy.port}/retrieve", f"+{latency:g}ms"
                for trainer in args.trainers:
                    result = run(root, env, steps, trainer=trainer, retriever_url=url, tag=tag, legacy=args.legacy)
                    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
        finally:
            os.kill(int(env["_retriever_pid"]), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
