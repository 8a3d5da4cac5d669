"""The flat scan's matmul in two layouts on this CPU: ``queries @ rows.T`` (what ``TorchFlatIndex`` computes) and
rows first, ``rows @ queries.T`` in blocks of rows, each block copied back transposed; then the same top-k.

    python benchmarks/cpu_scan_layout.py [--rows 100000] [--dim 384] [--block 8192] [--rounds 7]

Which is faster depends on the CPU's BLAS (MKL packs the transposed operand of the first). Random unit vectors, k = 3,
best of ``--rounds`` per batch size after a warm-up, the two layouts taking turns (``cpu_features.best_seconds``); both
must give the same ids.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.cpu_features import best_seconds  # noqa: E402
from local_dense_retriever.index.topk import block_topk  # noqa: E402


def queries_first(queries: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor, block: int):
    return block_topk(torch.matmul(queries, rows.T, out=scores), 3)


def rows_first(queries: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor, block: int):
    part = torch.empty(block, len(queries))
    transposed = queries.T
    for lo in range(0, len(rows), block):
        piece = rows[lo : lo + block]
        scores[:, lo : lo + len(piece)].copy_(torch.matmul(piece, transposed, out=part[: len(piece)]).T)
    return block_topk(scores, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--block", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = torch.nn.functional.normalize(torch.randn(args.rows, args.dim), dim=1)
    print(
        f"# flat scan layouts: {args.rows:,} x {args.dim} float32, blocks of {args.block:,} rows, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs ({platform.machine()}), torch {torch.__version__}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print("| queries | queries @ rows.T, ms | rows first, ms | speed-up | same ids |")
    print("|---:|---:|---:|---:|---|")
    for n in (1, 8, 40, 64, 256):
        queries = torch.nn.functional.normalize(torch.randn(n, args.dim), dim=1)
        scores = torch.empty(n, args.rows)
        layouts = {"queries first": queries_first, "rows first": rows_first}
        runs = {name: partial(layout, queries, rows, scores, args.block) for name, layout in layouts.items()}
        best = best_seconds(runs, repeats=args.rounds)
        a, b = best["queries first"] * 1e3, best["rows first"] * 1e3
        same = bool(torch.equal(runs["queries first"]()[1], runs["rows first"]()[1]))
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
