"""faiss's flat search by batch size with the BLAS threshold it ships and with the one the server sets
(``local_dense_retriever.index.faiss_index.blas_threshold``: BLAS from ``BLAS_MIN_QUERIES`` queries on).

    python benchmarks/faiss_blas.py [--rows 100000] [--dim 384] [--rounds 5]

faiss picks its way of scoring a batch by ``faiss.cvar.distance_compute_blas_threshold`` (process-wide); faiss-cpu
1.15 ships 128,000 and compares it with a batch's queries x dimension (faiss PR #5022; older faiss shipped 20 and
compared it with the query count). This times ``IndexFlatIP.search`` (k = 5, random unit vectors) with the shipped
value and with the server's, best of ``--rounds`` after a warm-up, the two taking turns (``cpu_features.best_seconds``),
and checks that both give the same ids. Then it times 8 queries with the threshold at 8 x d - 1, 8 x d and 8 x d + 1,
which shows whether the installed faiss counts query elements (the switch is there) or queries.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.cpu_features import best_seconds  # noqa: E402
from local_dense_retriever.index.faiss_index import BLAS_MIN_QUERIES, blas_threshold  # noqa: E402


def search_ids(index, batch: np.ndarray, threshold: int) -> np.ndarray:
    """The ids of ``index.search(batch, 5)`` with faiss's BLAS threshold set to ``threshold``."""
    faiss.cvar.distance_compute_blas_threshold = threshold
    return index.search(batch, 5)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    queries = rng.standard_normal((64, args.dim), dtype=np.float32)
    index = faiss.IndexFlatIP(args.dim)
    index.add(rows)
    shipped = faiss.cvar.distance_compute_blas_threshold
    server = blas_threshold(args.dim, shipped=shipped)
    if server is None:
        sys.exit(f"faiss {faiss.__version__} ships threshold {shipped}, a rule the server does not know")
    print(
        f"# faiss {faiss.__version__} flat IP, {args.rows:,} x {args.dim}, k = 5, "
        f"{faiss.omp_get_max_threads()} threads, {os.cpu_count()} CPUs ({platform.machine()}), "
        f"its threshold {shipped:,}, the server's {server:,} (BLAS from {BLAS_MIN_QUERIES} queries), "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(f"| queries | threshold {shipped:,}, ms | threshold {server:,}, ms | speed-up | same ids |")
    print("|---:|---:|---:|---:|---|")
    for n in (1, 2, 3, 4, 8, 16, 32, 64):
        runs = {name: partial(search_ids, index, queries[:n], t) for name, t in (("shipped", shipped), ("set", server))}
        best = best_seconds(runs, repeats=args.rounds)
        shipped_ms, set_ms = best["shipped"] * 1e3, best["set"] * 1e3
        same = bool((runs["shipped"]() == runs["set"]()).all())
        print(f"| {n} | {shipped_ms:.1f} | {set_ms:.1f} | {shipped_ms / set_ms:.2f}x | {'yes' if same else 'NO'} |")
    print(f"\n# what the threshold counts: 8 queries of dimension {args.dim} (8 x d = {8 * args.dim:,} elements)")
    print("| threshold | ms |")
    print("|---:|---:|")
    around = {t: partial(search_ids, index, queries[:8], t) for t in (8 * args.dim - 1, 8 * args.dim, 8 * args.dim + 1)}
    for threshold, seconds in best_seconds(around, repeats=args.rounds).items():
        print(f"| {threshold:,} | {seconds * 1e3:.1f} |")
    faiss.cvar.distance_compute_blas_threshold = shipped


if __name__ == "__main__":
    main()
