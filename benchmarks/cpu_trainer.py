"""GRPO on verl's real trainer on this CPU (tiny Qwen2, search tool, real retriever): start-up to first step, seconds
per step and its split, and peak resident memory summed over every process of the run, for 1 and 2 ranks.

    python benchmarks/cpu_trainer.py [--ranks 1 2] [--steps 3]

Invariant: one run at a time; each run lives in its own process group, which is ended when the run ends.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
SPLIT = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/update_weights"]
#: per-trajectory agent-loop times (mean over the batch's trajectories); only verl's legacy trainer logs them
AGENT_LOOP = ["timing_s/agent_loop/generate_sequences/mean", "timing_s/agent_loop/tool_calls/mean"]
#: the test kit's opening policy (verl_search.testing.forced_prefix): a random model searches and answers
FORCED = (
    "opening_policy:{path:verl_search.testing.forced_prefix.ForcedOpenings,search_every:2,answer:Paris,answer_every:1},"
    "max_tokens_per_turn:48"
)


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


def prepare(root: Path) -> dict[str, str]:
    """A tiny model, the real retriever (embedded toy default) and mixed tool_agent/search_r1_agent data."""
    from verl_search.testing.background_server import free_port, wait_until_healthy
    from verl_search.train.tiny_model import write_tiny_model

    model = write_tiny_model(root / "tiny")
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

    (data / "mixed").mkdir()
    for split in ("train", "val_subset"):
        a, b = (pd.read_parquet(data / t / f"{split}.parquet") for t in ("tool_call", "search_r1"))
        pd.concat([f.iloc[[i]] for i in range(min(len(a), len(b))) for f in (a, b)], ignore_index=True).to_parquet(
            data / "mixed" / f"{split}.parquet"
        )
    tools = root / "tools.yaml"
    import yaml

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


def run(root: Path, env: dict[str, str], ranks: int, steps: int, legacy: bool = False) -> dict:
    run_dir = root / f"run-{ranks}{'-legacy' if legacy else ''}"
    metrics_path = run_dir / "metrics.jsonl"
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update({k: v for k, v in env.items() if not k.startswith("_")})
    full.update(
        PYTHON=sys.executable,
        RUN_DIR=str(run_dir),
        N_RANKS=str(ranks),
        TOTAL_STEPS=str(steps),
        VERL_FILE_LOGGER_PATH=str(metrics_path),
        LOGGER='["console","file"]',
    )
    options = [f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{{FORCED}}}"]
    if legacy:
        options.append("trainer.use_v1=False")
    start = time.monotonic()
    process = subprocess.Popen(
        ["bash", str(REPO / "run_scripts" / "run_tiny_search_cpu.sh"), *options],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sampler = RssSampler(process.pid)
    sampler.start()
    first_step_at = None
    while process.poll() is None:
        if first_step_at is None and metrics_path.exists() and metrics_path.read_text().strip():
            first_step_at = time.monotonic() - start
        time.sleep(0.5)
    sampler.stopped.set()
    if process.returncode != 0:
        raise RuntimeError(f"the {ranks}-rank run exited with {process.returncode}")
    rows = [json.loads(line)["data"] for line in metrics_path.read_text().splitlines()]
    later = rows[1:] or rows  # step 1 includes warm-up
    return {
        "ranks": ranks,
        "trainer": "legacy RayPPOTrainer" if legacy else "v1",
        "startup_to_first_step_s": first_step_at,
        "wall_s": time.monotonic() - start,
        "step_s": statistics.mean(r["timing_s/step"] for r in later),
        **{key: statistics.mean(r.get(key, 0.0) for r in later) for key in SPLIT},
        **{key: statistics.mean(r[key] for r in later) for key in AGENT_LOOP if all(key in r for r in later)},
        "peak_rss_gb": sampler.peak / 2**30,
        "processes_at_peak": sampler.peak_processes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--legacy", action="store_true", help="verl's legacy RayPPOTrainer (trainer.use_v1=False): adds tool-call time"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cpu-trainer-bench-") as tmp:
        env = prepare(Path(tmp))
        try:
            for ranks in args.ranks:
                result = run(Path(tmp), env, ranks, args.steps, legacy=args.legacy)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
        finally:
            os.kill(int(env["_retriever_pid"]), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
