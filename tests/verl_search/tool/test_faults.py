"""Retriever failures: deadline honoured, only timeouts/connection errors/429/503 retried, labelled text + metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from cpu_bench.background_server import free_port
from verl_search import SearchTool, search_stats

SLACK = 0.5  # seconds a call may run past its deadline (event-loop scheduling on a loaded 2-core machine)


async def call(config, arguments=None):
    tool = SearchTool(config.model_dump())
    instance_id, _ = await tool.create()
    started = time.monotonic()
    response, _, metrics = await tool.execute(instance_id, arguments or {"query_list": ["Paris"]})
    await tool.release(instance_id)
    return response.text, metrics, time.monotonic() - started


async def test_healthy_server_returns_search_r1_text(stub, make_config):
    text, metrics, _ = await call(make_config())
    assert text.splitlines()[0] == 'Doc 1(Title: "Paris") Paris is the capital and largest city of France.'
    assert not text.lstrip().startswith(("{", "["))
    assert metrics["ok"] is True and metrics["failure"] is None


async def test_slow_server_is_cut_off_at_the_deadline(stub, make_config):
    stub.state.set_fault("slow", slow_seconds=10)
    text, metrics, elapsed = await call(make_config(timeout=0.6, attempt_timeout=0.25, max_attempts=5))
    assert elapsed < 0.6 + SLACK
    assert text.startswith("[search failed: timeout]")
    assert "did not answer within 0.6 s" in text
    assert "not an empty result" in text
    assert metrics == {**metrics, "ok": False, "failure": "timeout"}
    assert stub.state.requests >= 2  # per-attempt timeouts are retried within the deadline
    assert search_stats()["failures"] == {"timeout": 1}


async def test_500_is_not_retried(stub, make_config):
    stub.state.set_fault("500")
    text, metrics, _ = await call(make_config())
    assert text.startswith("[search failed: server_error]")
    assert metrics["failure"] == "server_error"
    assert stub.state.requests == 1


@pytest.mark.parametrize("request_format", ["auto", "search_r1"])
async def test_400_is_not_retried(stub, make_config, request_format):
    config = make_config(request_format=request_format)
    await call(config)  # the endpoint's wire form is known from here on
    stub.state.requests = 0
    stub.state.set_fault("400")
    text, metrics, _ = await call(config, {"query_list": ["Danube"]})
    assert text.startswith("[search failed: rejected]")
    assert stub.state.requests == 1


async def test_400_from_an_endpoint_of_unknown_form_gets_one_single_query_request(stub, make_config):
    stub.state.set_fault("400")
    text, metrics, _ = await call(make_config())
    assert text.startswith("[search failed: rejected]")
    assert stub.state.requests == 2  # the batch form, then SkyRL's single-query form once; never a retry


async def test_503_is_retried_up_to_max_attempts(stub, make_config):
    stub.state.set_fault("503")
    text, metrics, _ = await call(make_config(max_attempts=3))
    assert text.startswith("[search failed: unavailable]")
    assert "could not be reached" in text
    assert stub.state.requests == 3
    assert search_stats()["retries"] == 2


async def test_429_then_success_is_retried_and_succeeds(stub, make_config):
    stub.state.set_fault("429", count=1)
    text, metrics, _ = await call(make_config())
    assert metrics["ok"] is True
    assert text.startswith('Doc 1(Title: "Paris")')
    assert stub.state.requests == 2


async def test_retry_after_that_does_not_fit_the_deadline_fails_fast(stub, make_config):
    stub.state.set_fault("429", retry_after=30)
    text, metrics, elapsed = await call(make_config(timeout=1.0, backoff_max=60))
    assert metrics["failure"] == "unavailable"
    assert stub.state.requests == 1
    assert elapsed < 1.0 + SLACK


@pytest.mark.parametrize("fault", ["bad_json", "wrong_shape"])
async def test_malformed_reply_is_not_retried(stub, make_config, fault):
    stub.state.set_fault(fault)
    text, metrics, _ = await call(make_config())
    assert text.startswith("[search failed: bad_response]")
    assert "unreadable reply" in text
    assert stub.state.requests == 1


async def test_connection_dropped_mid_reply_is_retried_then_labelled(stub, make_config):
    stub.state.set_fault("drop")
    text, metrics, _ = await call(make_config(max_attempts=2))
    assert metrics["failure"] == "unavailable"
    assert stub.state.requests == 2


async def test_connection_dropped_once_recovers(stub, make_config):
    stub.state.set_fault("drop", count=1)
    text, metrics, _ = await call(make_config())
    assert metrics["ok"] is True
    assert stub.state.requests == 2


async def test_connection_refused_is_labelled_unavailable(make_config):
    dead = f"http://127.0.0.1:{free_port()}"
    text, metrics, elapsed = await call(make_config(retrieval_service_url=dead, max_attempts=3))
    assert text.startswith("[search failed: unavailable]")
    assert metrics["failure"] == "unavailable"
    assert elapsed < 2.0 + SLACK


async def test_many_concurrent_calls_to_a_dead_server_all_end_by_the_deadline(stub, make_config):
    # 50 calls through 2 connections: 48 wait for a slot. Each must end at its own deadline, the wait included (a call
    # that waited its turn for a slot would end after 25 rounds of 0.5 s, one that waited for the server after 30 s).
    # Two connections, not 50: cancelling 50 in-flight requests on one loaded event loop once took 1.96 s in all
    stub.state.set_fault("slow", slow_seconds=30)
    config = make_config(timeout=0.5, attempt_timeout=0.5, num_workers=2)
    tool = SearchTool(config.model_dump())
    started = time.monotonic()
    results = await asyncio.gather(*(tool.execute(f"i{i}", {"query_list": [f"q{i}"]}) for i in range(50)))
    assert time.monotonic() - started < 0.5 + SLACK
    assert all(metrics["failure"] == "timeout" for _, _, metrics in results)


async def test_stats_count_calls_and_failures(stub, make_config):
    config = make_config()
    await call(config)
    stub.state.set_fault("500")
    await call(config, {"query_list": ["Danube"]})
    stats = search_stats()
    assert stats["calls"] == 2
    assert stats["failures"] == {"server_error": 1}
    assert stats["failed_calls"] == 1
    assert stats["latency_p99_s"] > 0
