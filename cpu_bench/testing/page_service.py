"""The real retrieval service (``local_dense_retriever``'s app under uvicorn on 127.0.0.1) over a small corpus and a
``--pages_path`` file, searched by word overlap: what tests of the access tool and of the native loop's ``<access>``
call. Invariant: hits and pages are exactly those of the rows given, so a test knows every url and window."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cpu_bench.background_server import BackgroundServer

_WORD = re.compile(r"\w+")


class WordOverlap:
    """A search backend for the real service: the corpus rows sharing the most words with the query."""

    def __init__(self, rows: Sequence[dict]) -> None:
        self._words = [set(_WORD.findall(row["contents"].lower())) for row in rows]

    def __len__(self) -> int:
        return len(self._words)

    def describe(self) -> str:
        return "word overlap"

    def search(self, queries: list[str], k: int):
        import numpy as np

        scores, ids = [], []
        for query in queries:
            q = set(_WORD.findall(query.lower()))
            ranked = sorted(range(len(self._words)), key=lambda i: (-len(q & self._words[i]), i))[:k]
            ids.append(ranked)
            scores.append([float(len(q & self._words[i])) for i in ranked])
        return np.asarray(scores, dtype=np.float32), np.asarray(ids, dtype=np.int64)


@contextmanager
def page_service(
    folder: Path, corpus: Sequence[dict], pages: Sequence[dict], wrap_pages: Callable[[Any], Any] = lambda s: s
) -> Iterator[BackgroundServer]:
    """The service serving ``corpus`` (search, and pages joined by url) and ``pages`` (its pages file, passed
    through ``wrap_pages``, e.g. to count reads); its files are written under ``folder``."""
    from local_dense_retriever.app import create_app
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.corpus_store import CorpusStore
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.pages import CorpusPages, PageStore

    corpus_path, pages_path = folder / "corpus.jsonl", folder / "pages.jsonl"
    corpus_path.write_text("".join(json.dumps(row) + "\n" for row in corpus))
    pages_path.write_text("".join(json.dumps(page) + "\n" for page in pages))
    store = CorpusStore(corpus_path, progress=False)
    page_file = wrap_pages(PageStore(pages_path, progress=False))
    engine = RetrievalEngine(
        WordOverlap(corpus), store, page_file=page_file, corpus_pages=CorpusPages(store, progress=False)
    )
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as server:
        server.pages = page_file
        yield server
