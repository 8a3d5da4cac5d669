"""TorchFlatIndex: exact inner product as matmul + top-k, on the CPU or sharded over every visible GPU, each shard
searched by a scan (``index.scan``; on the CPU optionally the pre-scan of ``accel``). Invariants: faiss IndexFlatIP's
answers up to float rounding; equal scores in id order, whatever the chunking; the loader and the memory plan place
rows with ``shard_devices`` and ``shard_bounds`` alone, so the plan logged is the split made."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.config import index_dtype
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.flat_file import STAGING_BYTES, VectorFile, read_flat_vectors, row_blocks, vector_file
from local_dense_retriever.index.index_info import IndexInfo, flat_info
from local_dense_retriever.index.scan import CPU_CHUNK_ROWS, SCORE_BYTES, ExactScan, ScanWrapper, ShardScan
from local_dense_retriever.index.topk import merge_topk
from local_dense_retriever.load_progress import LoadProgress
from local_dense_retriever.memory import release_mapped_pages

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def shard_devices(device: torch.device) -> list[torch.device]:
    """Every visible GPU (CUDA_VISIBLE_DEVICES) for any CUDA ``device``, else the one CPU."""
    if device.type == "cuda":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


def shard_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` of ``parts`` contiguous shards of ``rows`` rows, as even as whole rows allow."""
    bounds = np.linspace(0, rows, parts + 1).astype(np.int64)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def index_source(path: Path, device: torch.device, dtype: str = "auto") -> np.ndarray | VectorFile:
    """The memory map when the shards are the file's float32 rows on the CPU, else the file to stream."""
    if device.type == "cpu" and index_dtype(dtype, device) == "float32":
        return read_flat_vectors(path)
    return vector_file(path)


class TorchFlatIndex:
    """Flat IP index held as torch shards: one on CPU, or one per visible GPU."""

    def __init__(
        self,
        vectors: np.ndarray | VectorFile,
        *,
        device: torch.device,
        dtype: str = "auto",
        cpu_chunk_rows: int = CPU_CHUNK_ROWS,
        staging_bytes: int = STAGING_BYTES,
        score_bytes: int = SCORE_BYTES,
        cpu_scan: ScanWrapper | None = None,
        progress: LoadProgress | None = None,
    ) -> None:
        """Shards of ``vectors``: float32 on the CPU used as is (a map stays one), else filled through
        ``staging_bytes`` of host memory; ``score_bytes`` bounds a search step's scores; ``cpu_scan`` builds the CPU
        shard's scan instead of the exact one."""
        self.dtype, self.device = _DTYPES[index_dtype(dtype, device)], device
        self._n, self.dim = (int(x) for x in vectors.shape)
        #: the devices holding the shards, in row order
        self.devices = shard_devices(device)
        row_bytes = self.dim * (4 if isinstance(vectors, VectorFile) else vectors.itemsize)
        zero_copy = isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 and self.dtype == torch.float32
        copied = not (zero_copy and device.type == "cpu")
        if progress is not None and copied:
            progress.expect(self._n * row_bytes)
        self._offsets: list[int] = []
        self._scans: list[ShardScan] = []
        for dev, (lo, hi) in zip(self.devices, shard_bounds(self._n, len(self.devices)), strict=True):
            if not copied:
                with warnings.catch_warnings():  # a read-only memory map: never written to
                    warnings.simplefilter("ignore", UserWarning)
                    part = torch.from_numpy(np.asarray(vectors[lo:hi]))
            else:  # host memory used by the copy does not grow with the index
                part = torch.empty((hi - lo, self.dim), dtype=self.dtype, device=dev)
                blocks = row_blocks(vectors, lo, hi, staging_bytes, pin=dev.type == "cuda", progress=progress)
                for a, block in blocks:
                    part[a - lo : a - lo + len(block)].copy_(torch.from_numpy(block))
            self._offsets.append(lo)
            self._scans.append(ExactScan(part, score_bytes=score_bytes, chunk_rows=cpu_chunk_rows))
        if cpu_scan is not None:
            if device.type != "cpu" or self.dtype != torch.float32:
                raise IndexLoadError(f"a CPU scan wraps a float32 index on the CPU; this one is {self.dtype} on "
                                     f"{device.type}")  # fmt: skip

            def rows_read(lo: int, hi: int) -> None:  # the copy's pages of a memory map leave RSS once read
                if isinstance(vectors, np.memmap):
                    release_mapped_pages(vectors[lo:hi])

            self._scans[0] = cpu_scan(self._scans[0], rows_read, progress)

    @classmethod
    def from_file(cls, path: Path, *, device: torch.device, dtype: str = "auto", **kw) -> TorchFlatIndex:
        """The index of ``path`` (``index_source``); ``kw`` as for the constructor."""
        return cls(index_source(Path(path), device, dtype), device=device, dtype=dtype, **kw)

    def __len__(self) -> int:
        return self._n

    @property
    def scan(self) -> ShardScan:
        """The first (on the CPU: the one) shard's scan."""
        return self._scans[0]

    @property
    def crowded_queries(self) -> int:
        """Queries a scan needed more than its usual work for (/metrics ``prefilter_crowded_queries_total``)."""
        return sum(scan.crowded_queries for scan in self._scans)

    def describe(self) -> str:
        scan = self._scans[0].describe()
        where = f"{len(self._scans)} x {self.device.type}" + ("" if scan == "exact scan" else f", {scan}")
        return f"torch flat IP, {self._n:,} x {self.dim} {str(self.dtype).removeprefix('torch.')} on {where}"

    def index_info(self, k: int) -> IndexInfo:
        """Exact (every row scored): recall 1.0; its memory: the vectors as held."""
        return flat_info(self._n, self.dim, self.dtype.itemsize, k, str(self.dtype).removeprefix("torch."))

    @torch.inference_mode()
    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query, best first; equal scores by lower id (``index.topk``: any split gives the same)."""
        k = min(k, self._n)
        parts = [scan.topk(queries, k) for scan in self._scans]
        scores = np.concatenate([s.numpy() for s, _ in parts], axis=1)
        ids = np.concatenate([i.numpy().astype(np.int64) + lo for (_, i), lo in zip(parts, self._offsets, strict=True)],
                             axis=1)  # fmt: skip
        return (scores, ids) if len(parts) == 1 else merge_topk(scores, ids, k)
