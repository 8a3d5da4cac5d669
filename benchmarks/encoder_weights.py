"""The memory a CPU query encoder holds once built, per model and precision: its weights and the process's growth.

    python benchmarks/encoder_weights.py                       # MiniLM and an e5-base-v2-shaped BERT, 3 precisions
    python benchmarks/encoder_weights.py --models minilm --dtypes int8

Each encoder is built in a fresh process, exactly as the server builds it (``HFEncoder``: packed on the CPU; int8
quantised, compiled and checked against float32), encodes 64 toy questions three times, and returns its free heap
(``malloc_trim``). Printed: the bytes of weights the encoder holds (``HFEncoder.weight_bytes``: each storage once),
how much the process's resident set grew from just before the model was loaded (all of it, and the anonymous part:
memory of its own rather than pages of mapped files), and how much of the resident set is pages of the model's own
files. No model hub is reachable here, so the e5-base-v2 row is a BERT of e5-base-v2's exact shape with seeded random
weights (``benchmarks/gpu_search_path.py``): its sizes are e5-base-v2's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 1 << 20


def measure(model: str, dtype: str) -> dict:
    """In this process: ``model``'s encoder in ``dtype`` built and used; what it holds, and what the process grew."""
    import torch

    from local_dense_retriever.encoder import HFEncoder
    from local_dense_retriever.memory import release_free_memory, resident_memory
    from local_dense_retriever.toy.questions import generate_questions
    from local_dense_retriever.toy.world import ToyWorld

    torch.set_num_threads(os.cpu_count() or 1)
    questions = [q["question"] for q in generate_questions(ToyWorld(2_000, seed=0), 64)]
    release_free_memory()
    before = resident_memory()
    encoder = HFEncoder(model, device="cpu", dtype=dtype)
    for _ in range(3):
        encoder.encode(questions)
    release_free_memory()
    after = resident_memory()
    return {
        "precision": encoder.precision,
        "weights": encoder.weight_bytes(),
        "rss": after["rss"] - before["rss"],
        "rss_anon": after["rss_anon"] - before["rss_anon"],
        "model_file": mapped_resident(Path(model)),
    }


def mapped_resident(folder: Path) -> int:
    """Bytes of this process's resident set that are pages of files in ``folder`` (the model's weights, mapped)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line: range, perms, ..., path
                inside = len(fields) > 5 and Path(fields[5]).parent == folder.resolve()
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["minilm", "e5-base"], choices=["minilm", "e5-base"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"])
    p.add_argument("--child", nargs=2, metavar=("MODEL_PATH", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0

    import torch

    from local_dense_retriever.encoder import bundled_minilm_path

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    now = datetime.now(timezone.utc)
    print(f"# encoder weights: {cpu}, {os.cpu_count()} CPUs, {platform.python_version()}, torch {torch.__version__}, "
          f"commit {commit}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    print(f"{'model':9} {'precision':9} {'weights MiB':>11} {'RSS growth MiB':>14} {'anonymous MiB':>13} "
          f"{'model file MiB':>14}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"minilm": bundled_minilm_path()}
        if "e5-base" in args.models:
            from gpu_search_path import e5_base_shaped

            paths["e5-base"] = e5_base_shaped(Path(tmp) / "e5-base-shaped", bundled_minilm_path())
        for model in args.models:
            for dtype in args.dtypes:
                child = [sys.executable, __file__, "--child", str(paths[model]), dtype]
                done = subprocess.run(child, capture_output=True, text=True)
                if done.returncode:
                    print(f"{model:9} {dtype:9} failed: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{model:9} {r['precision']:9} {r['weights'] / MIB:>11.1f} {r['rss'] / MIB:>14.1f} "
                      f"{r['rss_anon'] / MIB:>13.1f} {r['model_file'] / MIB:>14.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
