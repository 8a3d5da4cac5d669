"""CorpusStore: a jsonl corpus read by row id through a saved byte-offset table; rows are never held in memory.
Invariant: the table describes exactly the corpus file of the recorded size, else it is rebuilt atomically."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.errors import CorpusError
from local_dense_retriever.load_progress import LoadProgress
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

_CHUNK = 64 << 20


def offsets_path_for(corpus_path: Path) -> Path:
    """Where the offsets table of ``corpus_path`` is saved: beside it."""
    return corpus_path.with_name(corpus_path.name + ".offsets.npy")


def build_offsets(
    corpus_path: Path, out_path: Path, *, progress: bool = True, load_progress: LoadProgress | None = None
) -> np.ndarray:
    """Scan ``corpus_path`` once and write its ``uint64`` line-start offsets, the file size last."""
    size = corpus_path.stat().st_size
    if load_progress is not None:
        load_progress.expect(size)
    starts: list[np.ndarray] = [np.zeros(1, dtype=np.uint64)]
    with (
        open(corpus_path, "rb") as f,
        tqdm(total=size, unit="B", unit_scale=True, desc=f"indexing {corpus_path.name}", disable=not progress) as bar,
    ):
        pos = 0
        while chunk := f.read(_CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.uint64)
            starts.append(nl + np.uint64(pos + 1))
            pos += len(chunk)
            bar.update(len(chunk))
            if load_progress is not None:
                load_progress.add(len(chunk))
    offsets = np.concatenate(starts)
    if offsets[-1] != size:  # file does not end with a newline: close the last row at EOF
        offsets = np.append(offsets, np.uint64(size))
    with atomic_path(out_path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, offsets)
    return offsets


class CorpusStore:
    """Row-id → document dict, read with ``os.pread`` (thread-safe; no per-row Python objects kept)."""

    def __init__(
        self,
        corpus_path: Path | str,
        *,
        offsets_path: Path | None = None,
        progress: bool = True,
        load_progress: LoadProgress | None = None,
    ) -> None:
        """``progress``: a progress bar while the offsets table is built (once); ``load_progress``: log lines."""
        self.path = Path(corpus_path)
        if self.path.suffix == ".gz":
            raise CorpusError(f"{self.path} is gzip-compressed: run `gunzip {self.path}` first")
        if not self.path.is_file():
            raise CorpusError(f"corpus file not found: {self.path}")
        self.offsets_path = offsets_path or offsets_path_for(self.path)
        size = self.path.stat().st_size
        offsets = self._load_offsets(size)
        if offsets is None:
            logger.info("building offsets table %s (once)", self.offsets_path)
            build_offsets(self.path, self.offsets_path, progress=progress, load_progress=load_progress)
            offsets = self._load_offsets(size)
            if offsets is None:
                raise CorpusError(f"offsets table {self.offsets_path} does not match {self.path}")
        self._offsets = offsets
        # trailing blank line(s) are not rows
        n = len(offsets) - 1
        while n > 0 and offsets[n] - offsets[n - 1] <= 1:
            n -= 1
        self._len = n
        self._fd = os.open(self.path, os.O_RDONLY)

    def _load_offsets(self, size: int) -> np.ndarray | None:
        if not self.offsets_path.is_file():
            return None
        try:
            offsets = np.load(self.offsets_path, mmap_mode="r")
        except (ValueError, OSError) as e:
            logger.warning("offsets table %s unreadable (%s); rebuilding", self.offsets_path, e)
            return None
        if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != size:
            logger.warning("offsets table %s is stale; rebuilding", self.offsets_path)
            return None
        return offsets

    def __len__(self) -> int:
        return self._len

    def raw(self, row: int) -> bytes:
        """The bytes of row ``row`` (without the newline)."""
        if not 0 <= row < self._len:
            raise IndexError(f"row {row} out of range for a corpus of {self._len} rows")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return os.pread(self._fd, end - start, start).rstrip(b"\r\n")

    def get(self, row: int) -> dict:
        """The document at row ``row`` as a dict (``id``, ``contents``, any other keys)."""
        data = self.raw(row)
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise CorpusError(f"{self.path} row {row} is not JSON: {data[:80]!r}") from e
        if not isinstance(doc, dict) or "contents" not in doc:
            raise CorpusError(f"{self.path} row {row} has no 'contents' field")
        doc.setdefault("id", str(row))
        doc["id"] = str(doc["id"])
        return doc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> CorpusStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
