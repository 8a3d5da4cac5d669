"""Token bucket and worker pool, driven by a fake clock: nothing here sleeps for real."""

from __future__ import annotations

import asyncio

import pytest

from verl_search.errors import DeadlineExceeded
from verl_search.pacing import TokenBucket
from verl_search.tool.limits import WorkerPool


class FakeClock:
    """A clock that only moves when slept on; records every sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_bucket_allows_a_burst_then_paces_at_the_rate():
    clock = FakeClock()
    bucket = TokenBucket(10, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        await bucket.acquire()
    assert clock.sleeps == []
    await bucket.acquire()
    await bucket.acquire()
    assert clock.sleeps == pytest.approx([0.1, 0.1])


async def test_bucket_rate_over_a_long_run_matches_the_limit():
    clock = FakeClock()
    bucket = TokenBucket(50, burst=1, clock=clock, sleep=clock.sleep)
    start = clock.now
    for _ in range(501):
        await bucket.acquire()
    assert clock.now - start == pytest.approx(10.0)  # 500 tokens after the first at 50/s


async def test_bucket_refills_while_idle_but_not_past_capacity():
    clock = FakeClock()
    bucket = TokenBucket(2, burst=2, clock=clock, sleep=clock.sleep)
    await bucket.acquire()
    await bucket.acquire()
    clock.now += 100  # a long idle period refills only to the burst size
    await bucket.acquire()
    await bucket.acquire()
    assert clock.sleeps == []
    await bucket.acquire()
    assert clock.sleeps == pytest.approx([0.5])


async def test_bucket_refuses_at_once_when_the_token_comes_after_the_deadline_and_refunds_it():
    clock = FakeClock()
    bucket = TokenBucket(1, burst=1, late=DeadlineExceeded, clock=clock, sleep=clock.sleep)
    await bucket.acquire()
    with pytest.raises(DeadlineExceeded, match="rate limit"):
        await bucket.acquire(deadline=clock.now + 0.5)
    assert clock.sleeps == []
    # the refused token was given back: the next caller waits one interval, not two
    await bucket.acquire(deadline=clock.now + 5)
    assert clock.sleeps == pytest.approx([1.0])


async def test_concurrent_waiters_are_served_in_order_one_interval_apart():
    clock = FakeClock()
    bucket = TokenBucket(4, burst=1, clock=clock, sleep=clock.sleep)
    await bucket.acquire()
    waits = [bucket.reserve() for _ in range(4)]
    assert waits == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_bucket_rejects_a_non_positive_rate():
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(0)


async def test_pool_caps_requests_in_flight():
    loop = asyncio.get_running_loop()
    pool = WorkerPool(3, clock=loop.time)
    release = asyncio.Event()
    peak = 0

    async def worker():
        nonlocal peak
        async with pool.slot(deadline=loop.time() + 60):
            peak = max(peak, pool.in_flight)
            await release.wait()

    tasks = [asyncio.create_task(worker()) for _ in range(10)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert pool.in_flight == 3 and pool.waiting == 7
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 3 and pool.in_flight == 0 and pool.waiting == 0


async def test_pool_wait_honours_the_deadline():
    loop = asyncio.get_running_loop()
    pool = WorkerPool(1, clock=loop.time)
    async with pool.slot(deadline=loop.time() + 60):
        with pytest.raises(DeadlineExceeded, match="workers busy"):
            async with pool.slot(deadline=loop.time() + 0.01):
                pass
        with pytest.raises(DeadlineExceeded):
            async with pool.slot(deadline=loop.time() - 1):
                pass
    assert pool.in_flight == 0 and pool.waiting == 0
    async with pool.slot(deadline=loop.time() + 1):  # the slot is free again
        assert pool.in_flight == 1
