"""The flat scan of a query batch on the CPU: its matmul in float32 and bfloat16, and the top-k after it.

    python benchmarks/cpu_flat_scan.py [--rows 100000] [--dim 384] [--batch 64] [--k 3]

Random unit vectors (the scan's cost does not depend on their values), the number of threads the server uses. Each
figure is the mean of 20 calls after a warm-up: ``matmul`` writes the (batch, rows) scores into one kept buffer as
``TorchFlatIndex`` does; ``topk`` is ``torch.topk`` over those float32 scores. On a CPU with AMX the bf16 matmul is the
measure of what a bf16 copy of the index would save (its scores are rounded: near-ties can swap).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone

import torch


def mean_ms(call, repeats: int = 20) -> float:
    call()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    index = torch.nn.functional.normalize(torch.randn(args.rows, args.dim, generator=gen), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(args.batch, args.dim, generator=gen), dim=-1)
    now = datetime.now(timezone.utc)
    print(f"# flat scan: {args.batch} queries x {args.rows:,} x {args.dim}, {args.threads} threads, {os.cpu_count()} "
          f"CPUs ({platform.processor() or platform.machine()}), {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    scores = torch.empty(args.batch, args.rows)
    fp32 = mean_ms(lambda: torch.matmul(queries, index.T, out=scores))
    topk = mean_ms(lambda: torch.topk(scores, args.k, dim=1))
    index_bf16, queries_bf16 = index.bfloat16(), queries.bfloat16()
    scores_bf16 = torch.empty(args.batch, args.rows, dtype=torch.bfloat16)
    bf16 = mean_ms(lambda: torch.matmul(queries_bf16, index_bf16.T, out=scores_bf16))
    print(f"matmul float32 {fp32:.1f} ms, bfloat16 {bf16:.1f} ms ({fp32 / bf16:.2f}x); top-{args.k} {topk:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
