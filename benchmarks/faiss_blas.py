"""faiss's flat search by batch size with the BLAS threshold it ships and with the one the server sets
(``local_dense_retriever.index.faiss_index.BLAS_MIN_QUERIES``).

    python benchmarks/faiss_blas.py [--rows 100000] [--dim 384] [--rounds 5]

faiss picks its way of scoring a batch by ``faiss.cvar.distance_compute_blas_threshold`` (process-wide); faiss-cpu
1.15 ships 128,000 queries. This times ``IndexFlatIP.search`` (k = 5, random unit vectors) with the shipped value and
with ``BLAS_MIN_QUERIES``, best of ``--rounds``, both in one process, and checks that both give the same ids.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.index.faiss_index import BLAS_MIN_QUERIES  # noqa: E402


def search_ms(index, batch: np.ndarray, rounds: int) -> tuple[float, np.ndarray]:
    """Best of ``rounds`` for ``index.search(batch, 5)`` in ms, and the ids it returned."""
    _, ids = index.search(batch, 5)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        index.search(batch, 5)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3, ids


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
    print(
        f"# faiss {faiss.__version__} flat IP, {args.rows:,} x {args.dim}, k = 5, "
        f"{faiss.omp_get_max_threads()} threads, {os.cpu_count()} CPUs ({platform.machine()}), "
        f"its threshold {shipped:,} queries, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(f"| queries | threshold {shipped:,}, ms | threshold {BLAS_MIN_QUERIES}, ms | speed-up | same ids |")
    print("|---:|---:|---:|---:|---|")
    for n in (1, 2, 4, 8, 16, 32, 64):
        batch = queries[:n]
        faiss.cvar.distance_compute_blas_threshold = shipped
        shipped_ms, shipped_ids = search_ms(index, batch, args.rounds)
        faiss.cvar.distance_compute_blas_threshold = BLAS_MIN_QUERIES
        set_ms, set_ids = search_ms(index, batch, args.rounds)
        same = bool((shipped_ids == set_ids).all())
        print(f"| {n} | {shipped_ms:.1f} | {set_ms:.1f} | {shipped_ms / set_ms:.2f}x | {'yes' if same else 'NO'} |")
    faiss.cvar.distance_compute_blas_threshold = shipped


if __name__ == "__main__":
    main()
