"""The flat scan's matmul in its two layouts on this CPU, and what ``--index_scan_layout auto`` makes of them.

    python benchmarks/cpu_scan_layout.py [--rows 100000] [--dim 384] [--rounds 7]

``queries @ rows.T`` as one product (``queries_first``) against ``rows @ queries.T`` in blocks of 8,192 rows, each
block copied back transposed (``rows_first``; ``local_dense_retriever/index/scan_layout.py``), each followed by the
same top-k (k = 3). Which is faster depends on the CPU's BLAS and the batch. Then the index the server builds:
``TorchFlatIndex`` under ``auto`` (its start-up probe, taken fresh here in a temporary cache directory, and the layout
it picks per batch size) against the same index held to ``queries_first`` (the layout before ``auto``), whole
searches timed. Random unit vectors; best of ``--rounds`` per batch size after a warm-up, the two taking turns
(``cpu_features.best_seconds``); both must give the same ids.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.cpu_features import best_seconds  # noqa: E402
from local_dense_retriever.index.scan_layout import PRODUCTS, probe_summary  # noqa: E402
from local_dense_retriever.index.topk import block_topk  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256)


def scan(product, queries: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor):
    return block_topk(product(queries, rows, scores, lambda r, q: torch.empty(r, q)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = torch.nn.functional.normalize(torch.randn(args.rows, args.dim), dim=1)
    print(
        f"# flat scan layouts: {args.rows:,} x {args.dim} float32, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), torch {torch.__version__}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print("\nThe two products (+ top-k):\n")
    print("| queries | queries first, ms | rows first, ms | rows first's speed-up | same ids |")
    print("|---:|---:|---:|---:|---|")
    for n in SIZES:
        queries = torch.nn.functional.normalize(torch.randn(n, args.dim), dim=1)
        scores = torch.empty(n, args.rows)
        runs = {name: partial(scan, product, queries, rows, scores) for name, product in PRODUCTS.items()}
        best = best_seconds(runs, repeats=args.rounds)
        a, b = best["queries_first"] * 1e3, best["rows_first"] * 1e3
        same = bool(torch.equal(runs["queries_first"]()[1], runs["rows_first"]()[1]))
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {'yes' if same else 'NO'} |")

    with tempfile.TemporaryDirectory() as cache:
        os.environ["VERL_SEARCH_CACHE"] = cache  # a fresh probe, not one remembered from an earlier start
        from local_dense_retriever.index.torch_flat import TorchFlatIndex

        t0 = time.perf_counter()
        auto = TorchFlatIndex(rows.numpy(), device=torch.device("cpu"), prefilter="off")
        took = time.perf_counter() - t0
    before = TorchFlatIndex(rows.numpy(), device=torch.device("cpu"), prefilter="off", scan_layout="queries_first")
    speed_ups = probe_summary(auto.layout.timings)
    print(f"\n`auto`'s probe: {took:.2f} s; rows first's speed-up per probed size: {speed_ups}")
    print(f"`auto` scans {auto.layout.describe()}\n")
    print("| queries | `queries_first`, ms | `auto`, ms | speed-up | `auto`'s layout | same ids |")
    print("|---:|---:|---:|---:|---|---|")
    for n in SIZES:
        queries = torch.nn.functional.normalize(torch.randn(n, args.dim), dim=1)
        runs = {"before": partial(before.search, queries, 3), "auto": partial(auto.search, queries, 3)}
        best = best_seconds(runs, repeats=args.rounds)
        a, b = best["before"] * 1e3, best["auto"] * 1e3
        same = bool((runs["before"]()[1] == runs["auto"]()[1]).all())
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {auto.layout.layout(n)} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
