"""Replies a provider should not send (outside its documented shape, nested past the parser, holding lone surrogates
or megabytes of hits) fail their own query as upstream_error, billed once and recorded nowhere, or are cleaned and
cut before they are recorded; and a spent budget is refused before any wait for a rate slot."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from local_dense_retriever.web.errors import BudgetExhausted, RateLimited, UpstreamError

DEEP = b"[" * 100_000 + b"]" * 100_000

WRONG_SHAPES = [
    ("serper", {}),
    ("serper", {"organic": "nothing"}),
    ("serper", {"organic": [1, 2]}),
    ("serper", {"message": "Not enough credits"}),
    ("serpapi", {"search_metadata": {"status": "Success"}}),
    ("serpapi", {"organic_results": ["a string"]}),
    ("brave", {"type": "search", "web": {"type": "search"}}),
    ("brave", {"web": {"results": []}}),
    ("brave", {"type": "search", "web": {"results": [None]}}),
]
NO_RESULTS = [
    ("serper", {"searchParameters": {"q": "x"}, "organic": []}),
    ("serpapi", {"error": "Google hasn't returned any results for this query."}),
    ("serpapi", {"search_information": {"organic_results_state": "Fully empty"}}),
    ("brave", {"type": "search", "query": {"original": "x"}}),
]


@pytest.mark.parametrize(("provider", "body"), WRONG_SHAPES, indirect=["provider"])
def test_a_reply_outside_the_documented_shape_fails_its_query_and_is_not_recorded(provider, web_backend, fault, body):
    provider.plan.append(fault(raw=json.dumps(body).encode()))
    backend = web_backend()
    failed, mate = backend.search(["odd reply", "its batch-mate"], 2)
    assert isinstance(failed, UpstreamError) and len(mate) == 2
    assert backend.budget.live_calls == 2  # billed once: the provider answered 200
    [again] = backend.search(["odd reply"], 2)  # nothing was recorded: a second call, answered normally
    assert len(again) == 2 and len(provider.requests) == 3


@pytest.mark.parametrize(("provider", "body"), NO_RESULTS, indirect=["provider"])
def test_only_a_documented_no_results_reply_is_recorded_as_empty(provider, web_backend, fault, body):
    provider.plan.append(fault(raw=json.dumps(body).encode()))
    backend = web_backend()
    assert backend.search(["nothing here"], 3) == [[]]
    assert backend.search(["nothing here"], 3) == [[]] and len(provider.requests) == 1


def test_json_nested_past_the_parser_is_an_upstream_error_billed_once(provider, web_server, fault):
    provider.plan.append(fault(raw=DEEP))
    url, engine = web_server()
    with ThreadPoolExecutor(2) as pool:  # two requests, one micro-batch; whichever is sent first gets the reply
        answers = pool.map(
            lambda q: httpx.post(f"{url}/retrieve", json={"queries": [q], "topk": 2}, timeout=30), ["deep", "mate"]
        )
        deep, mate = sorted(answers, key=lambda a: a.status_code, reverse=True)
    assert deep.status_code == 502 and deep.json()["error"] == "upstream_error" and mate.status_code == 200
    assert "not a JSON object (HTTP 200, after 1 attempt)" in deep.json()["detail"]
    assert len(provider.requests) == 2 and engine.backend.budget.live_calls == 2  # never called again


def test_lone_surrogates_and_control_characters_in_hits_are_cleaned_then_recorded(provider, web_server, fault):
    raw = (
        b'{"organic": [{"title": "a\\ud800b\\u0007", "link": "https://x.example/\\udfff", '
        b'"snippet": "c\\u0000d\\u001be\\ud83d\\ude00"}]}'
    )
    provider.plan.append(fault(raw=raw))
    url, _ = web_server()
    for _ in range(2):
        answer = httpx.post(f"{url}/retrieve", json={"queries": ["surrogates"], "topk": 2})
        assert answer.status_code == 200
        [[doc]] = answer.json()["result"]
        assert doc["contents"] == '"a\ufffdb"\ncde\U0001f600' and doc["url"] == "https://x.example/\ufffd"
    assert len(provider.requests) == 1  # recorded, then answered from the cache


def test_a_reply_of_many_long_hits_is_cut_to_k_before_it_is_recorded(provider, web_backend, fault, tmp_path):
    hits = [{"title": "t" * 5000, "link": f"https://e.example/{i}", "snippet": "s" * 10_000} for i in range(400)]
    provider.plan.append(fault(raw=json.dumps({"organic": hits}).encode()))
    backend = web_backend()
    [answer] = backend.search(["many hits"], 3)
    assert len(answer) == 3 and all(len(doc["contents"]) <= 2600 for doc, _ in answer)
    with sqlite3.connect(tmp_path / "web.sqlite3") as db:
        [(size,)] = db.execute("SELECT length(hits) FROM answers").fetchall()
    assert size < 10_000


def test_a_reply_past_the_size_limit_fails_its_query_unread_and_unrecorded(provider, web_backend, fault):
    provider.plan.append(fault(raw=b'{"organic": [' + b" " * (9 << 20) + b"]}"))
    backend = web_backend()
    [failed] = backend.search(["huge"], 2)
    assert isinstance(failed, UpstreamError) and "larger than 8 MiB" in str(failed)
    assert backend.search(["huge"], 2)[0] and len(provider.requests) == 2


def test_a_spent_budget_is_refused_without_waiting_for_a_rate_slot(provider, web_backend):
    backend = web_backend(web_qps=1.0, web_timeout_s=3.0, web_max_live_calls=2)  # one slot a second
    results = backend.search([f"burst {i}" for i in range(12)], 2)
    assert sum(isinstance(r, list) for r in results) == 2
    assert sum(isinstance(r, BudgetExhausted) for r in results) == 10
    assert not [r for r in results if isinstance(r, RateLimited)]


def test_rate_limited_only_for_queries_the_budget_would_still_pay_for(provider, web_backend):
    backend = web_backend(web_qps=1.0, web_timeout_s=1.5, web_max_live_calls=3)  # slots at 0 and 1 s only
    results = backend.search([f"wave {i}" for i in range(12)], 2)
    kinds = [type(r).__name__ if not isinstance(r, list) else "answered" for r in results]
    assert kinds.count("answered") == 2 and kinds.count("RateLimited") == 10  # the third call is still paid for
    assert backend.budget.live_calls == 2  # the calls that found no slot were taken back
    backend.budget.charge()  # the last call of the budget
    [refused] = backend.search(["wave 99"], 2)
    assert isinstance(refused, BudgetExhausted)
