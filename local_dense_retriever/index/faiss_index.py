"""FaissIndex: any faiss index file (flat, HNSW, IVF, ...) on CPU, or an fp16 copy sharded over all GPUs.

Invariant: ids returned are corpus rows; faiss's -1 padding never reaches callers (k is capped at the index size).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.index.base import IndexLoadError

logger = logging.getLogger(__name__)

#: the server's ``faiss.cvar.distance_compute_blas_threshold`` (process-wide): from this many queries on, faiss
#: scores a batch with BLAS matmuls over blocks of rows. faiss-cpu 1.15 ships 128,000, with which a batch's time grew
#: with every query: over 100k x 384 rows on a 2-core Zen 3, 64 queries took 496 ms against 65 ms, 16 queries 138
#: against 38, one query 21 either way; a batch of exactly two is the exception, 16 against 31 ms
#: (``benchmarks/faiss_blas.py``; same ids)
BLAS_MIN_QUERIES = 8


class FaissIndex:
    """Wraps a faiss index read from disk."""

    def __init__(self, path: Path, *, gpu: bool = False) -> None:
        import faiss

        path = Path(path)
        if not path.is_file():
            raise IndexLoadError(f"index file not found: {path}")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            raise IndexLoadError(f"{path} is not a faiss index file: {str(e).splitlines()[0]}") from e
        self._where = "cpu"
        if hasattr(faiss.cvar, "distance_compute_blas_threshold"):
            faiss.cvar.distance_compute_blas_threshold = BLAS_MIN_QUERIES
        if gpu:
            ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
            if ngpu == 0:
                raise IndexLoadError("--faiss_gpu needs faiss-gpu (`pip install faiss-gpu`) and a visible CUDA GPU")
            co = faiss.GpuMultipleClonerOptions()
            co.useFloat16 = True
            co.shard = True
            index = faiss.index_cpu_to_all_gpus(index, co=co)
            self._where = f"{ngpu} GPU(s), fp16 shards"
        self._index = index
        self.dim = int(index.d)
        self._kind = "sharded" if gpu else type(faiss.downcast_index(index)).__name__

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def describe(self) -> str:
        return f"faiss {self._kind}, {len(self):,} x {self.dim} on {self._where}"

    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries.detach().float().cpu().numpy())
        scores, ids = self._index.search(q, min(k, len(self)))
        if (ids < 0).any():  # approximate indexes may return fewer hits than asked: drop the padding columns
            keep = int((ids >= 0).sum(axis=1).min())
            scores, ids = scores[:, :keep], ids[:, :keep]
        return scores.astype(np.float32), ids.astype(np.int64)
