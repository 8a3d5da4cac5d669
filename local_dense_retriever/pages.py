"""Pages by url for ``POST /access``, and the url of every hit. ``PageStore``: the pages of a JSONL file (one object
with a ``url`` per line). ``CorpusPages``: pages joined from the corpus rows: a row's url is its ``url`` field, else
the Wikipedia link of its title (its ``title`` field, else the first line of ``contents`` unquoted); a url's page is
its rows' texts in corpus order. Invariant: each url table (sorted url hashes with offsets or rows, beside its file;
``corpus_store.saved_table``) matches its file, else it is rebuilt; a lookup compares each candidate's url, so a hash
collision never mixes pages."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from tqdm import tqdm

from local_dense_retriever.corpus_store import CorpusStore, saved_table
from local_dense_retriever.errors import CorpusError, PagesError
from local_dense_retriever.load_progress import LoadProgress

WIKI_BASE = "https://en.wikipedia.org/wiki/"
#: rows one page may join (a wiki-18 article has a few hundred 100-word passages at most)
MAX_PAGE_ROWS = 1024
#: rows between two counts told to the load's progress while the corpus url table is built
REPORT_ROWS = 1 << 16
#: characters Wikipedia leaves unencoded in its article links
_SAFE = "/:@!$&'()*+,;=-._~"


def normalize_url(url: str) -> str:
    """ASearcher's rule: a MediaWiki ``index.php/Title`` URL is stored as ``index.php?title=Title``."""
    return url.replace("index.php/", "index.php?title=") if "index.php/" in url else url


def url_hash(url: str) -> int:
    """The 64-bit key a url table sorts by (normalise the url first)."""
    return int.from_bytes(hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def title_of(doc: dict[str, Any]) -> str:
    """The row's ``title`` field, else the first line of ``contents`` without its surrounding double quotes."""
    title = doc.get("title")
    if isinstance(title, str):
        return title
    first = str(doc.get("contents", "")).split("\n", 1)[0].strip()
    return first[1:-1] if len(first) >= 2 and first[0] == first[-1] == '"' else first


def url_of(doc: dict[str, Any]) -> str:
    """The row's ``url`` field, else the Wikipedia link of its title."""
    url = doc.get("url")
    if isinstance(url, str) and url:
        return url
    return WIKI_BASE + quote(title_of(doc).replace(" ", "_"), safe=_SAFE)


def text_of(doc: dict[str, Any]) -> str:
    """The row's ``contents`` without its title line."""
    contents = str(doc.get("contents", ""))
    first, newline, rest = contents.partition("\n")
    if newline and first.strip().strip('"') == title_of(doc):
        return rest
    return contents


def _url_table(path: Path, size: int, rows: int | None, build, error: type[Exception]) -> tuple[np.ndarray, ...]:
    """``(hashes, values)`` of the table at ``path`` for a file of ``size`` bytes (and ``rows`` rows, when known);
    ``build()`` gives ``(hashes, values)`` in file order when it must be rebuilt."""

    def fits(t: np.ndarray) -> bool:
        return t.ndim == 2 and t.shape[1] == 2 and int(t[0, 0]) == size and rows in (None, int(t[0, 1]))

    def table() -> np.ndarray:
        hashes, values = build()
        order = np.argsort(hashes, kind="stable")
        out = np.empty((len(hashes) + 1, 2), dtype=np.uint64)
        out[0] = (size, len(hashes))
        out[1:, 0], out[1:, 1] = hashes[order], values[order]
        return out

    t = saved_table(path, fits, table, error)
    return t[1:, 0], t[1:, 1]


def _span(sorted_hashes: np.ndarray, url: str) -> range:
    """The positions in ``sorted_hashes`` holding ``url``'s hash (candidates: the caller checks the stored url)."""
    h = np.uint64(url_hash(url))
    return range(int(np.searchsorted(sorted_hashes, h, "left")), int(np.searchsorted(sorted_hashes, h, "right")))


def table_path_for(corpus_path: Path) -> Path:
    """Where the url table of a corpus is saved: beside it."""
    return corpus_path.with_name(corpus_path.name + ".urls.npy")


class PageStore:
    """url → page dict (the JSON object of its line in the pages file)."""

    def __init__(self, pages_path: Path | str, *, progress: bool = True) -> None:
        self.path = Path(pages_path)
        if not self.path.is_file():
            raise PagesError(f"pages file not found: {self.path}")
        self._progress = progress
        table = self.path.with_name(self.path.name + ".page_offsets.npy")
        self._hashes, self._offsets = _url_table(table, self.path.stat().st_size, None, self._scan, PagesError)
        self._fd = os.open(self.path, os.O_RDONLY)

    def _scan(self) -> tuple[np.ndarray, np.ndarray]:
        """One pass over the file: (hash, offset) of every line with a string ``url``."""
        hashes, offsets = [], []
        with (
            open(self.path, "rb") as f,
            tqdm(total=self.path.stat().st_size, unit="B", unit_scale=True, disable=not self._progress) as bar,
        ):
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
        return np.asarray(hashes, dtype=np.uint64), np.asarray(offsets, dtype=np.uint64)

    def __len__(self) -> int:
        return len(self._hashes)

    def _line(self, offset: int) -> bytes:
        chunks = []
        while chunk := os.pread(self._fd, 1 << 16, offset):
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
        for i in _span(self._hashes, url):
            page = json.loads(self._line(int(self._offsets[i])))
            if page.get("url") == url:
                return page
        return None


class CorpusPages:
    """url -> the page joined from the corpus rows of that url (see the module's rule)."""

    def __init__(
        self, corpus: CorpusStore, *, progress: bool = True, load_progress: LoadProgress | None = None
    ) -> None:
        self.corpus = corpus
        size, n = corpus.path.stat().st_size, len(corpus)

        def scan() -> tuple[np.ndarray, np.ndarray]:
            hashes = np.empty(n, dtype=np.uint64)
            if load_progress is not None:
                load_progress.expect(n)
            for row in tqdm(range(n), desc=f"urls of {corpus.path.name}", unit="row", disable=not progress):
                hashes[row] = url_hash(normalize_url(url_of(corpus.get(row))))
                if load_progress is not None and (row + 1) % REPORT_ROWS == 0:
                    load_progress.add(REPORT_ROWS)
            if load_progress is not None:
                load_progress.add(n % REPORT_ROWS)
            return hashes, np.arange(n, dtype=np.uint64)

        self._hashes, self._rows = _url_table(table_path_for(corpus.path), size, n, scan, CorpusError)

    def get(self, url: str) -> dict[str, Any] | None:
        """The page of ``url``, or None when no corpus row has that url."""
        wanted = normalize_url(url)
        span = _span(self._hashes, wanted)
        rows = sorted(int(r) for r in self._rows[span.start : span.stop])
        docs = [doc for doc in map(self.corpus.get, rows) if normalize_url(url_of(doc)) == wanted]
        if not docs:
            return None
        docs = docs[:MAX_PAGE_ROWS]
        return {"url": url_of(docs[0]), "title": title_of(docs[0]), "contents": "\n\n".join(map(text_of, docs))}
