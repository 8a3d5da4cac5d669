"""``make gpu-smoke``: the check to run on a GPU node before a long job. Two GRPO steps of a small instruct model from
the hub, through the GPU recipe's own script, against the toy world's retriever started on this node; then the
three things a long run depends on: searches reached the retriever, the search results were kept out of the loss
(``search/unmasked_results_share``), a checkpoint was written.

Invariant: everything it writes lives under ``--out``; the retriever it starts (BM25 over the generated toy corpus,
on the CPU: no download, no GPU memory taken from training) is stopped on every exit. ``--dry-run`` runs everything
up to the script's preflight and passes no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cpu_bench.background_server import free_port, wait_until_healthy
from verl_search.errors import VerlSearchError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "run_scripts" / "run_qwen2.5-3b_instruct_search_multiturn.sh"
#: the toy world's size: enough questions for a few steps on 8 GPUs, built in seconds
PASSAGES = 2000
#: at most this share of the trajectories shown search results may have nothing masked (a result cut exactly at the
#: end of a response can leave none behind); a broken mask gives 1.0
UNMASKED_LIMIT = 0.1


class SmokeError(VerlSearchError):
    """A stage of the smoke run failed; the message names it and where its output is."""

    kind = "gpu_smoke"


@dataclass(frozen=True)
class Smoke:
    """One smoke run's settings."""

    out: Path
    model: str
    rollout: str
    n_gpus: int
    steps: int
    dry_run: bool

    @property
    def name(self) -> str:
        return f"gpu-smoke-{time.strftime('%Y%m%d-%H%M%S')}"


def run(cmd: list[str], log: Path, what: str, **kwargs) -> None:
    """Run ``cmd`` with its output in ``log``; a failure names ``what`` and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, **kwargs)
    if done.returncode != 0:
        raise SmokeError(f"{what} failed (exit {done.returncode}); its output: {log}")


def toy_data(out: Path) -> tuple[Path, Path]:
    """The toy world's corpus and its questions as verl parquet files (train, test, val_subset): (corpus, data dir)."""
    world, data = out / "world", out / "data"
    py = sys.executable
    if not (world / "qa.jsonl").is_file():
        run([py, "-m", "local_dense_retriever.toy.corpus", "--out_dir", str(world), "--num_passages", str(PASSAGES)],
            out / "logs" / "toy_corpus.log", "generating the toy corpus", cwd=REPO)  # fmt: skip
    if not (data / "val_subset.parquet").is_file():
        run([py, str(REPO / "data_preprocess" / "preprocess_searchR1_dataset.py"), "--config", "prompt.yaml",
             "--input_jsonl", str(world / "qa.jsonl"), "--data_source", "toy", "--splits", "train", "test",
             "--val_per_source", "16", "--local_dir", str(data), "--no_progress"],
            out / "logs" / "preprocess.log", "preprocessing the toy questions", cwd=REPO)  # fmt: skip
    return world / "corpus.jsonl", data


def start_retriever(corpus: Path, out: Path, timeout: float = 600.0) -> tuple[subprocess.Popen, str]:
    """The toy world's retriever (BM25, CPU) on 127.0.0.1, healthy; returns the process and its base URL."""
    port = free_port()
    log = out / "logs" / "retriever.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(REPO / "local_dense_retriever" / "retrieval_server.py"), "--corpus_path", str(corpus),
           "--retriever_name", "bm25", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=timeout, what="toy retriever")
    except RuntimeError as e:
        raise SmokeError(f"{e}; its output: {log}") from e
    return process, url


def requests_served(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return int(json.load(response).get("requests_total", 0))


def script_env(smoke: Smoke, data: Path, url: str, run_dir: Path, name: str) -> dict[str, str]:
    """The GPU recipe's knobs for two small steps: batches that divide among any number of GPUs, short responses,
    a checkpoint at the last step, a validation pass, metrics in the run folder, no wandb."""
    batch = str(2 * smoke.n_gpus)
    knobs = {
        "MODEL_PATH": smoke.model, "ROLLOUT": smoke.rollout, "N_GPUS": str(smoke.n_gpus), "DATA_DIR": str(data),
        "RETRIEVER_URL": f"{url}/retrieve", "EXPERIMENT_NAME": name, "RUN_DIR": str(run_dir),
        "TRAIN_BATCH_SIZE": batch, "PPO_MINI_BATCH_SIZE": batch, "ROLLOUT_N": "4", "MICRO_BATCH_PER_GPU": "2",
        "VAL_BATCH_SIZE": "16", "MAX_PROMPT_LENGTH": "1024", "MAX_RESPONSE_LENGTH": "1024",
        "MAX_TOKEN_LEN_PER_GPU": "4096", "GPU_MEMORY_UTILIZATION": "0.4", "SAVE_FREQ": str(smoke.steps),
        "TEST_FREQ": str(smoke.steps), "LOGGER": '["console","file"]', "PYTHON": sys.executable,
        "DRY_RUN": "1" if smoke.dry_run else "0",
    }  # fmt: skip
    return {**os.environ, **knobs}


def check_run(run_dir: Path, steps: int, served: int) -> list[str]:
    """The smoke run's findings, one line each; a line starting with ``FAILED`` is a failed check."""
    lines = [f"{'ok' if served > 0 else 'FAILED'}: the retriever answered {served} search request(s)"]
    metrics_file = run_dir / "metrics.jsonl"
    logged: dict[int, dict] = {}
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                logged.setdefault(int(row["step"]), {}).update(row.get("data", {}))
    trained = sorted(s for s, m in logged.items() if any(k.startswith("actor/") for k in m))
    lines.append(f"{'ok' if len(trained) >= steps else 'FAILED'}: steps logged in {metrics_file}: {trained}")
    calls = max((m.get("search/calls_per_traj/mean", 0.0) for m in logged.values()), default=0.0)
    lines.append(f"{'ok' if calls > 0 else 'FAILED'}: searches per trajectory, best step: {calls:.2f}")
    unmasked = [m["search/unmasked_results_share"] for m in logged.values() if "search/unmasked_results_share" in m]
    if not unmasked:
        lines.append("FAILED: no trajectory was shown search results, so their masking could not be checked")
    else:
        worst = max(unmasked)
        verdict = "ok" if worst <= UNMASKED_LIMIT else "FAILED"
        lines.append(f"{verdict}: trajectories shown results with nothing kept out of the loss: {worst:.1%} at worst")
    checkpoint = run_dir / "checkpoints" / f"global_step_{steps}" / "actor"
    lines.append(f"{'ok' if checkpoint.is_dir() else 'FAILED'}: checkpoint {checkpoint}")
    return lines


def smoke_run(smoke: Smoke) -> int:
    corpus, data = toy_data(smoke.out)
    name = smoke.name
    run_dir = smoke.out / "runs" / name
    retriever, url = start_retriever(corpus, smoke.out)
    try:
        before = requests_served(url)
        cmd = ["bash", str(SCRIPT), f"trainer.total_training_steps={smoke.steps}"]
        print(f"gpu-smoke: {smoke.steps} GRPO steps of {smoke.model} on {smoke.n_gpus} GPU(s) ({smoke.rollout}); "
              f"retriever {url}; run folder {run_dir}", flush=True)  # fmt: skip
        done = subprocess.run(cmd, env=script_env(smoke, data, url, run_dir, name), cwd=smoke.out, check=False)
        if done.returncode != 0:
            raise SmokeError(f"the training script failed (exit {done.returncode}); its output is above")
        if smoke.dry_run:
            print("gpu-smoke: dry run: the script's checks passed; nothing was trained")
            return 0
        lines = check_run(run_dir, smoke.steps, requests_served(url) - before)
    finally:
        retriever.terminate()
        retriever.wait(timeout=30)
    print("\n".join(f"gpu-smoke: {line}" for line in lines))
    failed = sum(line.startswith("FAILED") for line in lines)
    print(f"gpu-smoke: {'FAILED' if failed else 'passed'}: {len(lines) - failed} of {len(lines)} checks")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cpu_bench.gpu_smoke", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="a small instruct model (hub id or folder)")
    p.add_argument("--rollout", default="sglang", choices=("sglang", "vllm"))
    p.add_argument("--n_gpus", type=int, default=0, help="GPUs to train on (default: every visible one)")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path(".cache/gpu-smoke"), help="where everything goes")
    p.add_argument("--dry-run", action="store_true", help="stop after the training script's checks (no GPU needed)")
    args = p.parse_args(argv)
    n_gpus = args.n_gpus
    if n_gpus <= 0:
        import torch

        n_gpus = torch.cuda.device_count()
        if n_gpus == 0 and not args.dry_run:
            print("gpu-smoke: error: no CUDA GPU is visible here (check on a machine without one: --dry-run)",
                  file=sys.stderr)  # fmt: skip
            return 1
    smoke = Smoke(args.out.absolute(), args.model, args.rollout, max(n_gpus, 1), args.steps, args.dry_run)
    try:
        return smoke_run(smoke)
    except SmokeError as e:
        print(f"gpu-smoke: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
