"""Encoder precision: time the bundled MiniLM query encoder per dtype on this CPU, and how far bf16 moves the vectors.

    python benchmarks/encoder_precision.py [--rounds 30]

Encodes toy questions one at a time and 64 at once, in float32 and bfloat16 (what "auto" picks on CPUs with bf16
instructions when it measures faster), in the same process, alternating dtypes each round; prints the median
milliseconds per call, the bf16/fp32 speed ratio and the smallest cosine similarity between a question's bf16 and
float32 vectors.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.cpu_features import cpu_has_amx  # noqa: E402
from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path  # noqa: E402
from local_dense_retriever.encoder_precision import cpu_bf16_flags  # noqa: E402
from local_dense_retriever.toy.questions import generate_questions  # noqa: E402
from local_dense_retriever.toy.world import ToyWorld  # noqa: E402

DTYPES = ("float32", "bfloat16")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="timed calls per dtype and batch size")
    args = p.parse_args()
    questions = [q["question"] for q in generate_questions(ToyWorld(2_000, seed=0), 64)]
    encoders = {d: HFEncoder(bundled_minilm_path(), retriever_name="minilm", device="cpu", dtype=d) for d in DTYPES}
    times: dict[tuple[str, int], list[float]] = {(d, b): [] for d in DTYPES for b in (1, 64)}
    for enc in encoders.values():  # warm-up
        enc.encode(questions)
        enc.encode(questions[:1])
    for _ in range(args.rounds):
        for (dtype, batch), samples in times.items():
            t0 = time.perf_counter()
            encoders[dtype].encode(questions[:batch])
            samples.append((time.perf_counter() - t0) * 1000)
    cos = torch.nn.functional.cosine_similarity(
        encoders["float32"].encode(questions), encoders["bfloat16"].encode(questions), dim=-1
    )
    now = datetime.now(timezone.utc)
    print(f"# encoder precision: all-MiniLM-L6-v2, {os.cpu_count()} CPUs, AMX={cpu_has_amx()}, "
          f"bf16 flags={cpu_bf16_flags()}, "
          f"torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC, median of {args.rounds}")  # fmt: skip
    print(f"{'dtype':9} {'batch 1 ms':>11} {'batch 64 ms':>12} {'q/s at 64':>10}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for d in DTYPES:
        print(f"{d:9} {med[(d, 1)]:>11.1f} {med[(d, 64)]:>12.1f} {64_000 / med[(d, 64)]:>10.0f}")
    print(f"bf16 speed-up: batch 1 {med[('float32', 1)] / med[('bfloat16', 1)]:.2f}x, "
          f"batch 64 {med[('float32', 64)] / med[('bfloat16', 64)]:.2f}x; "
          f"min cosine(bf16, fp32) over {len(questions)} questions = {cos.min().item():.5f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
