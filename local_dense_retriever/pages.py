"""PageStore: full pages by URL (``POST /access``) from a JSONL file, never held in memory. Invariant: its table
(sorted URL hashes and offsets) matches the file's recorded size, else it is rebuilt; a lookup checks the URL."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.errors import PagesError
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)


def normalize_url(url: str) -> str:
    """ASearcher's rule: a MediaWiki ``index.php/Title`` URL is stored as ``index.php?title=Title``."""
    return url.replace("index.php/", "index.php?title=") if "index.php/" in url else url


def url_hash(url: str) -> int:
    """The 64-bit key a url table sorts by (normalise the url first)."""
    return int.from_bytes(hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def hash_span(sorted_hashes: np.ndarray, url: str) -> range:
    """The positions in ``sorted_hashes`` holding ``url``'s hash (candidates: the caller checks the stored url)."""
    h = np.uint64(url_hash(url))
    lo = int(np.searchsorted(sorted_hashes, h, side="left"))
    return range(lo, int(np.searchsorted(sorted_hashes, h, side="right")))


def table_path_for(pages_path: Path) -> Path:
    return pages_path.with_name(pages_path.name + ".urls.npz")


def build_table(pages_path: Path, out_path: Path, *, progress: bool = True) -> None:
    """One pass over the file: (hash, offset) of every line with a string ``url``, sorted by hash, saved atomically."""
    hashes: list[int] = []
    offsets: list[int] = []
    size = pages_path.stat().st_size
    with open(pages_path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, disable=not progress) as bar:
        pos = 0
        for line in f:
            try:
                url = json.loads(line).get("url")
            except (ValueError, AttributeError):
                url = None
            if isinstance(url, str):
                hashes.append(url_hash(url))
                offsets.append(pos)
            pos += len(line)
            bar.update(len(line))
    h = np.asarray(hashes, dtype=np.uint64)
    o = np.asarray(offsets, dtype=np.uint64)
    order = np.argsort(h, kind="stable")
    with atomic_path(out_path) as tmp:
        with open(tmp, "wb") as out:
            np.savez(out, hashes=h[order], offsets=o[order], size=np.asarray([size], dtype=np.uint64))


class PageStore:
    """URL → page dict (the JSON object of its line), read with ``os.pread``."""

    def __init__(self, pages_path: Path | str, *, progress: bool = True) -> None:
        self.path = Path(pages_path)
        if not self.path.is_file():
            raise PagesError(f"pages file not found: {self.path}")
        table = table_path_for(self.path)
        size = self.path.stat().st_size
        loaded = self._load(table, size)
        if loaded is None:
            logger.info("indexing the urls of %s (once)", self.path.name)
            build_table(self.path, table, progress=progress)
            loaded = self._load(table, size)
            if loaded is None:
                raise PagesError(f"url table {table} does not match {self.path}")
        self._hashes, self._offsets = loaded
        self._fd = os.open(self.path, os.O_RDONLY)

    @staticmethod
    def _load(table: Path, size: int) -> tuple[np.ndarray, np.ndarray] | None:
        if not table.is_file():
            return None
        try:
            with np.load(table) as z:
                if int(z["size"][0]) != size:
                    return None
                return z["hashes"], z["offsets"]
        except (OSError, ValueError, KeyError):
            return None

    def __len__(self) -> int:
        return len(self._hashes)

    def _line(self, offset: int) -> bytes:
        chunks = []
        while True:
            chunk = os.pread(self._fd, 1 << 16, offset)
            if not chunk:
                break
            nl = chunk.find(b"\n")
            if nl >= 0:
                chunks.append(chunk[:nl])
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def get(self, url: str) -> dict | None:
        """The page stored under ``url`` (after ASearcher's ``index.php/`` rewrite), or None."""
        url = normalize_url(url)
        for i in hash_span(self._hashes, url):
            page = json.loads(self._line(int(self._offsets[i])))
            if page.get("url") == url:
                return page
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
