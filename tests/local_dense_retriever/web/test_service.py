"""The retrieval service on the web backend, end to end over HTTP: the Search-R1 wire format, /health and /metrics,
per-query failures as labelled JSON errors that spare batch-mates, and a key that is never written anywhere."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from local_dense_retriever.batcher import Batcher
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.web.errors import BudgetExhausted


def test_retrieve_answers_in_the_search_r1_wire_format(provider, web_server):
    url, _ = web_server()
    scored = httpx.post(f"{url}/retrieve", json={"queries": ["paul walker", "paris"], "topk": 2,
                                                 "return_scores": True}).json()  # fmt: skip
    bare = httpx.post(f"{url}/retrieve", json={"queries": ["paul walker"], "topk": 2}).json()
    first = scored["result"][0]
    assert [set(hit) for hit in first] == [{"document", "score"}] * 2
    assert set(first[0]["document"]) == {"id", "contents", "url"} and first[0]["score"] > first[1]["score"]
    assert bare["result"][0] == [hit["document"] for hit in first]
    single = httpx.post(f"{url}/retrieve", json={"query": "paris", "topk": 2}).json()  # SkyRL's form
    assert single["result"][0] == [hit["document"] for hit in scored["result"][1]]
    assert len(provider.requests) == 2


def test_health_describes_the_cache_and_budget_and_metrics_count_them(provider, web_server):
    url, _ = web_server(web_max_live_calls=1, web_cost_per_call=0.005)
    httpx.post(f"{url}/retrieve", json={"queries": ["one"], "topk": 2})
    httpx.post(f"{url}/retrieve", json={"queries": ["one"], "topk": 2})
    refused = httpx.post(f"{url}/retrieve", json={"queries": ["two"], "topk": 2})
    assert refused.status_code == 503 and refused.json()["error"] == "budget_exhausted"
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.json()["passages"] is None
    detail = health.json()["detail"]
    assert detail.startswith("web search (serper, cache_first); cache web.sqlite3: 1 answers, hit rate 33% of 3")
    assert "run 'default': 1 live calls of 1, $0.005 spent, 1 budget refusals, 0 replay misses" in detail
    metrics = httpx.get(f"{url}/metrics").json()
    web = metrics["web"]
    assert web["cache_hits_total"] == 1 and web["cache_hit_rate"] == pytest.approx(1 / 3)
    assert web["live_requests_total"] == 1 and web["run_spend_usd"] == pytest.approx(0.005)
    assert web["budget_refusals_total"] == 1 and metrics["errors_by_kind"] == {"budget_exhausted": 1}


def test_a_replay_miss_is_a_503_not_cached_and_nothing_is_sent(provider, web_server, monkeypatch):
    url, _ = web_server()
    httpx.post(f"{url}/retrieve", json={"queries": ["recorded"], "topk": 2})
    provider.requests.clear()
    monkeypatch.delenv("SERPER_API_KEY")
    replay_url, _ = web_server(web_cache_mode="replay")
    hit = httpx.post(f"{replay_url}/retrieve", json={"queries": ["recorded"], "topk": 2})
    miss = httpx.post(f"{replay_url}/retrieve", json={"queries": ["recorded", "never seen"], "topk": 2})
    assert hit.status_code == 200 and len(hit.json()["result"][0]) == 2
    assert miss.status_code == 503 and miss.json()["error"] == "not_cached"
    assert "'never seen' has no cached serper answer" in miss.json()["detail"]
    assert provider.requests == []
    assert httpx.get(f"{replay_url}/metrics").json()["web"]["replay_misses_total"] == 1


def test_a_provider_that_keeps_failing_is_a_502_upstream_error(provider, web_server, fault):
    provider.plan.extend([fault(status=500, message="internal")] * 3)
    url, _ = web_server()
    answer = httpx.post(f"{url}/retrieve", json={"queries": ["down"], "topk": 2})
    assert answer.status_code == 502 and answer.json()["error"] == "upstream_error"
    assert answer.json()["detail"] == "upstream_error: serper answered an error status (HTTP 500, after 3 attempts)"


async def test_a_failed_query_fails_only_its_own_request_in_a_shared_batch(provider, web_backend):
    from local_dense_retriever.engine import RetrievalEngine

    engine = RetrievalEngine(web_backend(web_max_live_calls=1), None)
    metrics = Metrics()
    batcher = Batcher(engine.search, max_batch_size=64, max_wait_s=0.05, max_queue=64, metrics=metrics)
    batcher.start()
    try:
        answered, refused = await asyncio.gather(
            batcher.submit(["gets the last call"], 2), batcher.submit(["finds the budget spent"], 2),
            return_exceptions=True,
        )  # fmt: skip
    finally:
        await batcher.stop()
    assert metrics.batches == 1  # both requests shared one micro-batch
    assert len(answered[0]) == 2 and isinstance(refused, BudgetExhausted)


@pytest.mark.parametrize("provider", ["serpapi"], indirect=True)
def test_the_key_reaches_no_log_metric_health_text_or_cache_file(provider, web_server, fault, secret, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    provider.plan.extend([fault(status=401, message="Invalid API key."), fault(hang=True),
                          fault(raw=b'{"organic_results": [tru'), fault(status=429, retry_after="0")])  # fmt: skip
    url, _ = web_server(web_timeout_s=1.0, web_max_attempts=2)
    texts = []
    for query in ["refused", "silent", "truncated", "busy then fine"]:
        texts.append(httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": 2}).text)
    assert all(request["params"]["api_key"] == secret for request in provider.requests)
    texts += [httpx.get(f"{url}/metrics").text, httpx.get(f"{url}/health").text, caplog.text]
    texts += [repr(r.__dict__) for r in caplog.records]
    assert not [t for t in texts if secret in t]
    assert "upstream_error" in texts[0] and "did not answer within" in texts[1] and "not a JSON" in texts[2]
    assert '"result"' in texts[3] and len(provider.requests) == 5
    for path in tmp_path.glob("web.sqlite3*"):  # the database and its WAL
        assert secret.encode() not in path.read_bytes()


def test_queries_past_the_provider_rate_are_a_429_the_tool_would_retry(provider, web_server):
    url, _ = web_server(web_qps=1.0, web_timeout_s=0.5)  # a burst of one call, the next slot a second later
    answer = httpx.post(f"{url}/retrieve", json={"queries": ["first", "second", "third"], "topk": 2})
    assert answer.status_code == 429 and answer.json()["error"] == "rate_limited"
    assert len(provider.requests) == 1
    retry = httpx.post(f"{url}/retrieve", json={"queries": ["first"], "topk": 2})  # its answer was kept
    assert retry.status_code == 200 and len(provider.requests) == 1
