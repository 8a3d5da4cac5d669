"""Each provider's adapter against a local stub answering in that provider's documented shapes: the request it sends,
the hits it reads, and what its errors, 429s, silence and truncated replies become."""

from __future__ import annotations

import logging

import pytest

from local_dense_retriever.web.errors import UpstreamError

ALL = pytest.mark.parametrize("provider", ["serper", "serpapi", "brave"], indirect=True)


@ALL
def test_a_query_is_answered_as_search_r1_documents_scored_by_rank(provider, web_backend, secret):
    backend = web_backend()
    [hits] = backend.search(["  Paul   WALKER "], 3)
    docs = [doc for doc, _ in hits]
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)
    assert docs[0]["contents"].startswith('"paul walker page 0"\nAbout paul walker, 0.')
    assert docs[0]["url"] == "https://example.org/paul-walker/0"
    assert len({d["id"] for d in docs}) == 3 and all(d["id"] == d["id"].strip() for d in docs)
    sent = provider.requests[-1]
    if provider.provider == "serper":
        assert sent["method"] == "POST" and sent["json"] == {"q": "paul walker", "num": 3}
        assert sent["headers"]["x-api-key"] == secret
    elif provider.provider == "serpapi":
        assert sent["method"] == "GET" and sent["params"] == {"engine": "google", "q": "paul walker", "num": "3",
                                                              "api_key": secret}  # fmt: skip
    else:
        assert sent["method"] == "GET" and sent["params"] == {"q": "paul walker", "count": "3"}
        assert sent["headers"]["x-subscription-token"] == secret and sent["headers"]["accept"] == "application/json"


def test_the_same_page_keeps_its_id_across_queries(provider, web_backend):
    backend = web_backend()
    first, second = backend.search(["paris", "Paris "], 2)
    assert [d["id"] for d, _ in first] == [d["id"] for d, _ in second]


@pytest.mark.parametrize("provider", ["brave"], indirect=True)
def test_brave_descriptions_lose_their_html_and_its_count_is_capped_at_20(provider, web_backend):
    [hits] = web_backend().search(["danube"], 50)
    assert hits[0][0]["contents"] == '"danube page 0"\nAbout danube, 0. & more'
    assert provider.requests[-1]["params"]["count"] == "20" and len(hits) == 20


@pytest.mark.parametrize("provider", ["serper"], indirect=True)
def test_a_serper_hit_without_a_snippet_is_kept_and_one_without_a_link_dropped(provider, web_backend, fault):
    raw = b'{"organic": [{"title": "A", "link": "https://a.example", "position": 1}, {"title": "no link"}]}'
    provider.plan.append(fault(raw=raw))
    [hits] = web_backend().search(["x"], 3)
    assert [d for d, _ in hits] == [{"id": hits[0][0]["id"], "contents": '"A"\n', "url": "https://a.example"}]


@pytest.mark.parametrize("provider", ["serpapi"], indirect=True)
def test_serpapis_no_results_answer_is_an_empty_result_not_a_failure(provider, web_backend, fault):
    provider.plan.append(fault(raw=b'{"error": "Google hasn\'t returned any results for this query."}'))
    backend = web_backend()
    assert backend.search(["zxqv"], 3) == [[]]
    assert backend.search(["zxqv"], 3) == [[]] and len(provider.requests) == 1  # the empty answer is cached


@ALL
@pytest.mark.parametrize("status", [401, 422])
def test_an_error_status_fails_that_query_at_once_naming_the_status(provider, web_backend, status, fault, caplog):
    caplog.set_level(logging.INFO)
    provider.plan.append(fault(status=status, message="Invalid API key."))
    backend = web_backend()
    bad, good = backend.search(["refused", "fine"], 2)
    assert isinstance(bad, UpstreamError) and f"answered an error status (HTTP {status}, after 1 attempt)" in str(bad)
    assert "Invalid API key." not in str(bad) and "it said: Invalid API key." in caplog.text
    assert len(good) == 2  # its batch-mate was answered
    assert len(provider.requests) == 2  # a 4xx is never retried
    assert backend.budget.live_calls == 1  # the refused call was not charged


@ALL
def test_429_is_retried_after_retry_after_then_answered(provider, web_backend, fault):
    provider.plan.extend([fault(status=429, message="Too many requests", retry_after="0.2"), fault(status=503)])
    backend = web_backend()
    [hits] = backend.search(["busy"], 2)
    assert len(hits) == 2 and len(provider.requests) == 3
    assert backend.budget.live_calls == 1


def test_a_provider_that_keeps_failing_is_given_up_after_the_allowed_attempts(provider, web_backend, fault):
    provider.plan.extend([fault(status=500, message="boom")] * 5)
    [failed] = web_backend(web_max_attempts=2).search(["down"], 2)
    assert isinstance(failed, UpstreamError) and "(HTTP 500, after 2 attempts)" in str(failed)
    assert len(provider.requests) == 2


def test_a_retry_after_past_the_deadline_gives_up_without_waiting_for_it(provider, web_backend, fault):
    provider.plan.append(fault(status=429, message="slow down", retry_after="3600"))
    [failed] = web_backend(web_timeout_s=2.0).search(["later"], 2)
    assert isinstance(failed, UpstreamError) and len(provider.requests) == 1


def test_a_provider_that_never_answers_fails_the_query_at_its_deadline(provider, web_backend, fault):
    provider.plan.extend([fault(hang=True)] * 3)
    [failed] = web_backend(web_timeout_s=0.5).search(["silence"], 2)
    assert isinstance(failed, UpstreamError) and "did not answer within" in str(failed)
    assert "http" not in str(failed)  # no URL in the text (SerpAPI's would carry the key)


@ALL
def test_a_truncated_reply_fails_the_query_without_a_retry(provider, web_backend, fault):
    provider.plan.append(fault(raw=b'{"organic": [{"title": "cut'))
    [failed] = web_backend().search(["cut"], 2)
    assert isinstance(failed, UpstreamError) and "not a JSON object" in str(failed)
    assert len(provider.requests) == 1


def test_a_reply_of_the_wrong_shape_fails_the_query(provider, web_backend, fault):
    provider.plan.append(fault(raw=b'{"organic": "nothing"}'))
    [failed] = web_backend().search(["odd"], 2)
    assert isinstance(failed, UpstreamError) and "not a list" in str(failed)


@pytest.mark.parametrize("provider", ["serpapi"], indirect=True)
def test_a_provider_echoing_the_key_has_it_taken_out_of_the_log(provider, web_backend, fault, secret, caplog):
    caplog.set_level(logging.INFO)
    provider.plan.append(fault(status=401, message=f"Invalid API key {secret}"))
    [failed] = web_backend().search(["echo"], 2)
    assert secret not in str(failed) and "Invalid API key" not in str(failed)
    assert secret not in caplog.text and "Invalid API key ***" in caplog.text


def test_an_unreachable_provider_fails_the_query_and_is_not_charged(provider, web_backend):
    from cpu_bench.background_server import free_port

    backend = web_backend(web_base_url=f"http://127.0.0.1:{free_port()}/search", web_max_attempts=2)
    [failed] = backend.search(["nobody"], 2)
    assert isinstance(failed, UpstreamError) and "cannot connect to serper" in str(failed)
    assert backend.budget.live_calls == 0
