"""Every hit carries a ``url`` (ASearcher's and RLinf's clients fetch pages by it), and ``POST /access`` answers it
with a page joined from the corpus: a row's url is its ``url`` field, else the Wikipedia link of its title (its
``title`` field, else the first line of ``contents`` unquoted); a url's page is its rows' texts in corpus order.

Invariant: the url table (sorted url hashes with rows, beside the corpus) matches the corpus file's recorded size,
else it is rebuilt atomically; a lookup compares each candidate row's url, so a hash collision never mixes pages.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from tqdm import tqdm

from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.errors import CorpusError
from local_dense_retriever.load_progress import LoadProgress
from local_dense_retriever.pages import hash_span, normalize_url, url_hash
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

WIKI_BASE = "https://en.wikipedia.org/wiki/"
#: rows one page may join (a wiki-18 article has a few hundred 100-word passages at most)
MAX_PAGE_ROWS = 1024
#: rows between two counts told to the load's progress while the url table is built
REPORT_ROWS = 1 << 16
#: characters Wikipedia leaves unencoded in its article links
_SAFE = "/:@!$&'()*+,;=-._~"


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


def table_path_for(corpus_path: Path) -> Path:
    return corpus_path.with_name(corpus_path.name + ".urls.npy")


def build_table(
    corpus: CorpusStore, out_path: Path, *, progress: bool = True, load_progress: LoadProgress | None = None
) -> None:
    """One pass over the corpus, saved atomically: row 0 ``(file size, rows)``, then ``(url hash, row)`` by hash."""
    n = len(corpus)
    hashes = np.empty(n, dtype=np.uint64)
    if load_progress is not None:
        load_progress.expect(n)
    for row in tqdm(range(n), desc=f"urls of {corpus.path.name}", unit="row", disable=not progress):
        hashes[row] = url_hash(normalize_url(url_of(corpus.get(row))))
        if load_progress is not None and (row + 1) % REPORT_ROWS == 0:
            load_progress.add(REPORT_ROWS)
    if load_progress is not None:
        load_progress.add(n % REPORT_ROWS)
    order = np.argsort(hashes, kind="stable")
    table = np.empty((n + 1, 2), dtype=np.uint64)
    table[0] = (corpus.path.stat().st_size, n)
    table[1:, 0] = hashes[order]
    table[1:, 1] = order.astype(np.uint64)
    with atomic_path(out_path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, table)


class CorpusPages:
    """url -> the page joined from the corpus rows of that url (see the module's rule)."""

    def __init__(
        self, corpus: CorpusStore, *, progress: bool = True, load_progress: LoadProgress | None = None
    ) -> None:
        self.corpus = corpus
        path = table_path_for(corpus.path)
        table = self._load(path)
        if table is None:
            logger.info("indexing the page urls of %s (once)", corpus.path.name)
            build_table(corpus, path, progress=progress, load_progress=load_progress)
            table = self._load(path)
            if table is None:
                raise CorpusError(f"url table {path} does not match {corpus.path}")
        self._hashes = table[1:, 0]
        self._rows = table[1:, 1]

    def _load(self, path: Path) -> np.ndarray | None:
        if not path.is_file():
            return None
        try:
            table = np.load(path, mmap_mode="r")
        except (OSError, ValueError):
            return None
        size, rows = self.corpus.path.stat().st_size, len(self.corpus)
        if table.ndim != 2 or table.shape[1] != 2 or tuple(map(int, table[0])) != (size, rows):
            return None
        return table

    def get(self, url: str) -> dict[str, Any] | None:
        """The page of ``url``, or None when no corpus row has that url."""
        wanted = normalize_url(url)
        span = hash_span(self._hashes, wanted)
        rows = sorted(int(r) for r in self._rows[span.start : span.stop])
        docs = [doc for doc in map(self.corpus.get, rows) if normalize_url(url_of(doc)) == wanted]
        if not docs:
            return None
        docs = docs[:MAX_PAGE_ROWS]
        return {"url": url_of(docs[0]), "title": title_of(docs[0]), "contents": "\n\n".join(map(text_of, docs))}
