"""CorpusStore: a jsonl corpus read by row id through a saved byte-offset table; rows are never held in memory.
Invariant: a saved table (``saved_table``: this one, the url tables of ``pages``) describes exactly the file of the
recorded size, else it is rebuilt atomically."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.errors import CorpusError
from local_dense_retriever.load_progress import LoadProgress
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

_CHUNK = 64 << 20


def saved_table(
    path: Path, fits: Callable[[np.ndarray], bool], build: Callable[[], np.ndarray], error: type[Exception]
) -> np.ndarray:
    """The array saved at ``path`` (memory-mapped) when ``fits`` accepts it, else ``build()``'s, saved atomically."""
    for attempt in range(2):
        try:
            table = np.load(path, mmap_mode="r")
            if fits(table):
                return table
            logger.warning("table %s is stale; rebuilding", path)
        except (OSError, ValueError) as e:
            if path.exists():
                logger.warning("table %s unreadable (%s); rebuilding", path, e)
        if attempt:
            break
        logger.info("building table %s (once)", path)
        data = build()
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, data)
    raise error(f"table {path} does not match the file it describes")


def offsets_path_for(corpus_path: Path) -> Path:
    """Where the offsets table of ``corpus_path`` is saved: beside it."""
    return corpus_path.with_name(corpus_path.name + ".offsets.npy")


def build_offsets(corpus_path: Path, *, progress: bool = True, load_progress: LoadProgress | None = None) -> np.ndarray:
    """Scan ``corpus_path`` once: its ``uint64`` line-start offsets, the file size last."""
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
    return offsets


class CorpusStore:
    """Row-id → document dict, read with ``os.pread`` (thread-safe; no per-row Python objects kept)."""

    def __init__(
        self, corpus_path: Path | str, *, progress: bool = True, load_progress: LoadProgress | None = None
    ) -> None:
        """``progress``: a progress bar while the offsets table is built (once); ``load_progress``: log lines."""
        self.path = Path(corpus_path)
        if self.path.suffix == ".gz":
            raise CorpusError(f"{self.path} is gzip-compressed: run `gunzip {self.path}` first")
        if not self.path.is_file():
            raise CorpusError(f"corpus file not found: {self.path}")
        size = self.path.stat().st_size
        self._offsets = offsets = saved_table(
            offsets_path_for(self.path),
            lambda t: t.ndim == 1 and len(t) >= 1 and int(t[-1]) == size,
            lambda: build_offsets(self.path, progress=progress, load_progress=load_progress),
            CorpusError,
        )
        n = len(offsets) - 1  # trailing blank line(s) are not rows
        while n > 0 and offsets[n] - offsets[n - 1] <= 1:
            n -= 1
        self._len = n
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self._len

    def get(self, row: int) -> dict:
        """The document at row ``row`` as a dict (``id``, ``contents``, any other keys)."""
        if not 0 <= row < self._len:
            raise IndexError(f"row {row} out of range for a corpus of {self._len} rows")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        data = os.pread(self._fd, end - start, start).rstrip(b"\r\n")
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
