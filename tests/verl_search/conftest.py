"""Fixtures for the tool tests: a real stub retrieval server on 127.0.0.1 and configs pointing at it."""

from __future__ import annotations

import pytest

from cpu_bench.testing.stub_retriever import StubServer
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.stats import STATS

CORPUS = [
    {"id": "0", "contents": '"Paul Walker"\nPaul Walker was an American actor known for the Fast and Furious films.'},
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Danube"\nThe Danube flows through Vienna, Budapest and Belgrade.'},
    {"id": "3", "contents": '"Marie Curie"\nMarie Curie was born in Warsaw and won two Nobel Prizes.'},
]


@pytest.fixture(scope="session")
def stub_server():
    with StubServer(CORPUS) as server:
        yield server


@pytest.fixture
def stub(stub_server):
    """The shared stub, reset to answer normally and with its counters at zero."""
    stub_server.state.set_fault("ok")
    stub_server.state.requests = 0
    stub_server.state.queries.clear()
    stub_server.state.retry_after = None
    STATS.reset()
    yield stub_server
    stub_server.state.set_fault("ok")


@pytest.fixture
async def make_config(stub):
    """Build a SearchToolConfig aimed at the stub (fast retries); closes the loop's HTTP sessions afterwards."""

    def make(**overrides) -> SearchToolConfig:
        raw = {"retrieval_service_url": stub.url, "timeout": 2.0, "backoff_base": 0.01, "backoff_max": 0.05}
        raw.update(overrides)
        return SearchToolConfig.from_dict(raw)

    yield make
    await RetrievalClient.close_all()


@pytest.fixture
def stub_corpus() -> list[dict]:
    return list(CORPUS)
