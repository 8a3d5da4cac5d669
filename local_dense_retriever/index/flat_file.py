"""The flat index files the torch backend reads (``.npy``, faiss IndexFlat): headers checked, float32 rows mapped or
streamed through one bounded staging buffer. Invariant: nothing is read beyond the header until rows are asked for;
a file shorter than its header says is an IndexLoadError, never rows of zeros."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.load_progress import LoadProgress

#: fourccs of faiss IndexFlat files (faiss/impl/index_write.cpp): inner product, L2, any other metric
_FLAT_FOURCC = {b"IxFI", b"IxF2", b"IxFl"}
_HEADER = struct.Struct("<iqqqBi")  # d, ntotal, two dummy idx_t, is_trained, metric_type
#: host memory one step of loading an index onto devices (or into another dtype) may use, whatever the index's size
STAGING_BYTES = 64 << 20


@dataclass(frozen=True)
class FlatHeader:
    """What a faiss IndexFlat file says about itself, and where its float32 vectors start."""

    metric: str  # 'inner_product', 'L2' or 'other-metric'
    dim: int
    ntotal: int
    offset: int


def is_flat_file(path: Path) -> bool:
    """Whether ``path`` starts as a faiss IndexFlat file does (any metric)."""
    with open(path, "rb") as f:
        return f.read(4) in _FLAT_FOURCC


def read_flat_header(path: Path) -> FlatHeader:
    """The header of a faiss IndexFlat file, read without its vectors."""
    with open(path, "rb") as f:
        head = f.read(4 + _HEADER.size + 4 + 8)
    fourcc = head[:4]
    if fourcc not in _FLAT_FOURCC:
        if len(fourcc) == 4 and fourcc.startswith(b"I") and fourcc.isalnum():  # every faiss index type starts so
            raise IndexLoadError(f"{path} is a faiss {fourcc.decode()} index, not a flat index: use --backend faiss")
        raise IndexLoadError(f"{path} is not a faiss index file (it starts with {fourcc!r})")
    if len(head) < 4 + _HEADER.size + 8:
        raise IndexLoadError(f"{path} is truncated: too short for a faiss flat index header")
    d, ntotal, _, _, _, metric_type = _HEADER.unpack_from(head, 4)
    pos = 4 + _HEADER.size + (4 if metric_type > 1 else 0)  # metric_arg (float) follows for metrics beyond L2
    (size,) = struct.unpack_from("<Q", head, pos)
    offset = pos + 8
    if d <= 0 or ntotal < 0 or size != ntotal * d:
        raise IndexLoadError(f"{path} has an inconsistent flat index header (d={d}, ntotal={ntotal}, floats={size})")
    if path.stat().st_size < offset + size * 4:
        raise IndexLoadError(f"{path} is truncated: too short for {ntotal} x {d} vectors")
    metric = {0: "inner_product", 1: "L2"}.get(metric_type, "other-metric")
    return FlatHeader(metric=metric, dim=d, ntotal=ntotal, offset=offset)


def read_flat_vectors(path: Path) -> np.ndarray:
    """Vectors (n, d) of a ``.npy`` or faiss flat inner-product file, memory-mapped (nothing read but the header)."""
    path = Path(path)
    if not path.is_file():
        raise IndexLoadError(f"index file not found: {path}")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, mmap_mode="r")
        except ValueError as e:
            raise IndexLoadError(f"{path} is not a readable .npy array: {e}") from e
        if arr.ndim != 2:
            raise IndexLoadError(f"{path} holds an array of shape {arr.shape}; expected (passages, dim)")
        return arr
    source = vector_file(path)  # the faiss header, checked for an inner-product flat index
    if source.rows == 0:
        return np.zeros((0, source.dim), dtype=np.float32)
    return np.memmap(path, dtype=np.float32, mode="r", offset=source.offset, shape=source.shape)


def row_blocks(
    vectors: np.ndarray | VectorFile,
    lo: int,
    hi: int,
    staging_bytes: int,
    *,
    pin: bool = False,
    progress: LoadProgress | None = None,
):
    """``(row, block)`` over rows ``[lo, hi)``, at most ``staging_bytes`` per block."""
    if isinstance(vectors, VectorFile):
        yield from vectors.steps(lo, hi, staging_bytes, pin=pin and torch.cuda.is_available(), progress=progress)
        return
    per_step = max(1, staging_bytes // (vectors.shape[1] * vectors.itemsize))
    for a in range(lo, hi, per_step):
        rows = vectors[a : min(hi, a + per_step)]
        block = np.ascontiguousarray(rows, dtype=np.float32)
        if progress is not None:
            progress.add(rows.nbytes)
        yield a, block


@dataclass(frozen=True)
class VectorFile:
    """The float32 rows of an index file, streamed by offset through one staging buffer, never mapped: loading them
    elsewhere (GPUs, another dtype) leaves nothing of the file in this process or the page cache."""

    path: Path
    offset: int
    rows: int
    dim: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.dim

    def steps(
        self,
        lo: int,
        hi: int,
        staging_bytes: int = STAGING_BYTES,
        *,
        pin: bool = False,
        progress: LoadProgress | None = None,
    ):
        """``(row, block)`` over rows ``[lo, hi)``, each a view of one staging buffer, valid until the next step."""
        per_step = max(1, staging_bytes // (self.dim * 4))
        staging = torch.empty((min(per_step, max(hi - lo, 1)), self.dim), dtype=torch.float32, pin_memory=pin)
        buf = staging.numpy()
        with open(self.path, "rb", buffering=0) as f:
            for a in range(lo, hi, per_step):
                block = buf[: min(per_step, hi - a)]
                start, view = self.offset + a * self.dim * 4, memoryview(block).cast("B")
                f.seek(start)
                got = 0
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise IndexLoadError(f"{self.path} ended at byte {start + got}: truncated while loading")
                    got += n
                if hasattr(os, "posix_fadvise"):  # read once: do not let the index crowd out the page cache
                    os.posix_fadvise(f.fileno(), start, len(view), os.POSIX_FADV_DONTNEED)
                if progress is not None:
                    progress.add(len(view))
                yield a, block


def vector_file(path: Path) -> VectorFile:
    """Where the vectors of a ``.npy`` (float32, C order) or faiss flat inner-product index file are."""
    path = Path(path)
    if not path.is_file():
        raise IndexLoadError(f"index file not found: {path}")
    if path.suffix == ".npy":
        arr = read_flat_vectors(path)  # validates the array; its memory map gives dtype, order and data offset
        if arr.dtype != np.float32 or not arr.flags.c_contiguous or not isinstance(arr, np.memmap):
            raise IndexLoadError(f"{path} holds {arr.dtype} vectors; the flat index streams float32 rows")
        return VectorFile(path, int(arr.offset), int(arr.shape[0]), int(arr.shape[1]))
    header = read_flat_header(path)
    if header.metric != "inner_product":
        raise IndexLoadError(f"{path} is a flat {header.metric} index; the torch backend scores inner product: use "
                             "--backend faiss")  # fmt: skip
    return VectorFile(path, header.offset, header.ntotal, header.dim)
