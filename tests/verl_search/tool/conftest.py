"""Fixtures of the access tool tests: the real retrieval service (``local_dense_retriever``'s app under uvicorn on
127.0.0.1 and an ephemeral port) over a small corpus and a ``--pages_path`` file, with its page reads counted and
steerable (held back, or failing) so tests see exactly what reached the server."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from cpu_bench.testing.page_service import page_service
from verl_search.tool.client import RetrievalClient
from verl_search.tool.stats import ACCESS_STATS, STATS

WIKI = "https://en.wikipedia.org/wiki/"

#: the long page: 12 paragraphs of about 250 characters, several windows at the smallest window size (1000)
PARAGRAPHS = [
    f"Paragraph {i} of the Paul Walker page. " + " ".join(f"fact{i}x{j} about his films and cars." for j in range(7))
    for i in range(1, 13)
]
PAGES = [
    {"url": WIKI + "Paul_Walker", "title": "Paul Walker", "contents": "\n\n".join(PARAGRAPHS)},
    {"url": WIKI + "Danube", "title": "Danube", "contents": "The Danube flows through Vienna."},
]
CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "1", "contents": '"Paris"\nParis hosts the Louvre.'},
    {"id": "2", "contents": '"Marie Curie"\nMarie Curie was born in Warsaw.'},
]


class SteerablePages:
    """The server's pages file, its reads counted; while ``gate`` is clear a read waits for it (at most 30 s), and a
    set ``error`` makes a read raise (the server answers 500)."""

    def __init__(self, store) -> None:
        self.store = store
        self.path = store.path
        self.reads = 0
        self.waiting = 0
        self.gate = threading.Event()
        self.gate.set()
        self.error: Exception | None = None

    def __len__(self) -> int:
        return len(self.store)

    def get(self, url: str):
        self.reads += 1
        self.waiting += 1
        try:
            self.gate.wait(30)
        finally:
            self.waiting -= 1
        if self.error is not None:
            raise self.error
        return self.store.get(url)

    def reset(self) -> None:
        self.reads = 0
        self.error = None
        self.gate.set()


@pytest.fixture(scope="session")
def served():
    """What the service serves: ``wiki`` (the url prefix), ``paragraphs`` of the long page, ``pages``, ``corpus``."""
    return SimpleNamespace(wiki=WIKI, paragraphs=PARAGRAPHS, pages=PAGES, corpus=CORPUS)


@pytest.fixture(scope="session")
def page_server(tmp_path_factory):
    """The real service, serving CORPUS (search, and pages joined by url) and PAGES (its pages file)."""
    with page_service(tmp_path_factory.mktemp("pages"), CORPUS, PAGES, SteerablePages) as server:
        yield server
        server.pages.gate.set()


@pytest.fixture
async def pages_server(page_server):
    """The shared service with its page counters at zero and reads let through; the loop's clients closed after."""
    page_server.pages.reset()
    ACCESS_STATS.reset()
    STATS.reset()
    yield page_server
    page_server.pages.reset()
    await RetrievalClient.close_all()  # every client of the loop, the access clients included


@pytest.fixture
def access_config(pages_server):
    """Factory: an access tool config dict aimed at the service (fast retries, the smallest window)."""

    def make(**overrides) -> dict:
        raw = {
            "retrieval_service_url": pages_server.url,
            "timeout": 5.0,
            "backoff_base": 0.01,
            "backoff_max": 0.05,
            "max_result_chars": 1000,
        }
        return {**raw, **overrides}

    return make
