"""The run's budget (a durable ledger per scope), the spend, the shared rate limit and the bounded backoff."""

from __future__ import annotations

import asyncio

import pytest

from local_dense_retriever.web.errors import BudgetExhausted, RateLimited
from verl_search.pacing import TokenBucket, backoff_seconds


def test_the_live_call_ceiling_refuses_misses_but_still_serves_the_cache(provider, web_backend):
    backend = web_backend(web_max_live_calls=2)
    a, b, c = backend.search(["alpha", "beta", "gamma"], 2)
    answered = [r for r in (a, b, c) if isinstance(r, list)]
    refused = [r for r in (a, b, c) if isinstance(r, BudgetExhausted)]
    assert len(answered) == 2 and len(refused) == 1 and len(provider.requests) == 2
    assert "budget of run 'default' is spent (2 live calls of 2" in str(refused[0])
    again = backend.search(["alpha", "beta"], 2)
    assert all(isinstance(r, list) for r in again) and len(provider.requests) == 2
    stats = backend.stats()
    assert stats["run_live_calls"] == 2 and stats["budget_refusals_total"] == 1


def test_a_restarted_server_continues_its_runs_budget_and_a_new_scope_starts_afresh(provider, web_backend):
    web_backend(web_max_live_calls=1).search(["first"], 2)
    [refused] = web_backend(web_max_live_calls=1).search(["second"], 2)
    assert isinstance(refused, BudgetExhausted)
    [answered] = web_backend(web_max_live_calls=1, web_budget_scope="run-2").search(["second"], 2)
    assert len(answered) == 2 and len(provider.requests) == 2


def test_the_spend_ceiling_counts_the_cost_of_each_call(provider, web_backend):
    backend = web_backend(web_cost_per_call=0.004, web_max_spend=0.01)
    results = backend.search([f"q{i}" for i in range(4)], 2)
    assert sum(isinstance(r, BudgetExhausted) for r in results) == 2
    assert backend.stats()["run_spend_usd"] == pytest.approx(0.008)


def test_a_refused_call_is_not_charged_and_a_zero_ceiling_makes_no_call(provider, web_backend, fault):
    provider.plan.append(fault(status=429, message="out of searches", retry_after="0"))
    backend = web_backend(web_max_live_calls=1, web_max_attempts=2)
    [answered] = backend.search(["after a 429"], 2)
    assert len(answered) == 2 and backend.stats()["run_live_calls"] == 1
    provider.requests.clear()
    [refused] = web_backend(web_max_live_calls=0, web_budget_scope="empty").search(["none"], 2)
    assert isinstance(refused, BudgetExhausted) and provider.requests == []


async def test_the_rate_limit_refuses_a_slot_it_could_only_give_after_the_deadline():
    loop = asyncio.get_running_loop()
    bucket = TokenBucket(2.0, late=RateLimited, clock=loop.time)
    deadline = loop.time() + 0.1
    await bucket.acquire(deadline)
    await bucket.acquire(deadline)  # the burst of two
    with pytest.raises(RateLimited, match="rate limit of 2 calls/s"):
        await bucket.acquire(deadline)


async def test_calls_past_the_burst_wait_their_turn_in_order():
    now = [0.0]
    bucket = TokenBucket(1.0, clock=lambda: now[0])
    order: list[int] = []

    async def take(i: int) -> None:
        await bucket.acquire(float("inf"))
        order.append(i)

    tasks = [asyncio.ensure_future(take(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert order == [0]  # the others sleep for their slots (1 and 2 s of the bucket's clock)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_backoff_is_bounded_and_honours_retry_after():
    assert all(0 <= backoff_seconds(n, 0.25, 4.0) <= 4.0 for n in (1, 2, 10, 10**6))
    assert backoff_seconds(10**9, 0.25, 4.0, at_least=7.5) == 7.5
