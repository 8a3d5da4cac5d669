"""The search tool against a real server on the web backend: a spent budget and a replay miss reach the model as
labelled failures, are not retried (retrying cannot help) and leave the endpoint in use."""

from __future__ import annotations

import httpx
import pytest

from verl_search import SearchTool, search_stats
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.stats import STATS


@pytest.fixture
async def tool_for():
    """Factory: server url -> (SearchTool, its config) with fast retries; closes the loop's sessions after."""
    STATS.reset()

    def make(url: str):
        config = SearchToolConfig.from_dict({"retrieval_service_url": url, "timeout": 5.0, "topk": 2,
                                             "backoff_base": 0.01, "backoff_max": 0.05})  # fmt: skip
        return SearchTool(config.model_dump()), config

    yield make
    await RetrievalClient.close_all()


async def test_a_spent_budget_is_a_budget_failure_sent_once(provider, web_server, tool_for):
    url, _ = web_server(web_max_live_calls=1)
    tool, config = tool_for(url)
    _, _, first = await tool.execute("t", {"query_list": ["the one call"]})
    response, _, metrics = await tool.execute("t", {"query_list": ["one too many"]})
    assert first["ok"] and metrics["failure"] == "budget"
    assert response.text.startswith("[search failed: budget] The search budget of this run is spent. ")
    assert "searching again will not help" in response.text
    assert httpx.get(f"{url}/metrics").json()["requests_total"] == 2  # no retry of the refused call
    assert RetrievalClient.shared(config).endpoints.endpoints[0].ejections == 0
    _, _, cached = await tool.execute("t", {"query_list": ["The one call"]})  # the cache still answers
    assert cached["ok"] and len(provider.requests) == 1
    assert search_stats()["failures"] == {"budget": 1}


async def test_a_replay_miss_is_unavailable_sent_once(provider, web_server, tool_for, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY")
    url, _ = web_server(web_cache_mode="replay")
    tool, config = tool_for(url)
    response, _, metrics = await tool.execute("t", {"query_list": ["never recorded"]})
    assert metrics["failure"] == "unavailable"
    assert response.text.startswith("[search failed: unavailable] The search engine replays recorded searches")
    assert httpx.get(f"{url}/metrics").json()["requests_total"] == 1
    assert RetrievalClient.shared(config).endpoints.endpoints[0].ejections == 0
    assert provider.requests == []
