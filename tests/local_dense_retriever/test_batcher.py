"""Batcher: concurrent requests share engine calls, each caller gets its own results, and no waiter is ever left."""

from __future__ import annotations

import asyncio
import threading

import pytest

from local_dense_retriever.batcher import Batcher, BatcherStopped, DirectRunner, Overloaded
from local_dense_retriever.metrics import Metrics


class Recorder:
    """A search function that answers query q with hits (q, j) for j < k, recording each call's batch."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail_with: Exception | None = None

    def __call__(self, queries: list[str], k: int):
        self.release.wait(10)
        self.calls.append((list(queries), k))
        if self.fail_with is not None:
            raise self.fail_with
        return [[({"id": f"{q}-{j}", "contents": q}, float(-j)) for j in range(k)] for q in queries]


def make(search, **kw) -> Batcher:
    opts = {"max_batch_size": 64, "max_wait_s": 0.005, "max_queue": 1000, "metrics": Metrics()} | kw
    batcher = Batcher(search, **opts)
    batcher.start()
    return batcher


async def test_concurrent_callers_get_their_own_results_in_few_batches():
    search = Recorder()
    batcher = make(search)
    ks = [1 + i % 5 for i in range(200)]
    results = await asyncio.gather(*(batcher.submit([f"q{i}a", f"q{i}b"], k) for i, k in enumerate(ks)))
    for i, (k, res) in enumerate(zip(ks, results, strict=True)):
        assert [[d["id"] for d, _ in hits] for hits in res] == [
            [f"q{i}a-{j}" for j in range(k)],
            [f"q{i}b-{j}" for j in range(k)],
        ]
    assert len(search.calls) < 30  # 400 queries coalesced, not 200 separate engine calls
    assert max(len(q) for q, _ in search.calls) <= 64
    await batcher.stop()


async def test_a_failing_batch_resolves_every_waiter_and_the_next_batch_works():
    search = Recorder()
    search.fail_with = RuntimeError("GPU fell off the bus")
    batcher = make(search)
    results = await asyncio.gather(*(batcher.submit([f"q{i}"], 2) for i in range(20)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "GPU fell off" in str(r) for r in results)
    search.fail_with = None
    assert (await batcher.submit(["again"], 1))[0][0][0]["id"] == "again-0"
    await batcher.stop()


async def test_wrong_result_count_is_an_error_for_every_waiter():
    batcher = make(lambda queries, k: [[]])
    results = await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "result lists" in str(r) for r in results)
    await batcher.stop()


async def test_full_queue_is_refused_with_overloaded():
    search = Recorder()
    search.release.clear()  # the first batch blocks in the engine
    batcher = make(search, max_queue=10, max_wait_s=0)
    first = asyncio.create_task(batcher.submit(["blocker"], 1))
    await asyncio.sleep(0.05)
    waiting = [asyncio.create_task(batcher.submit([f"q{i}"], 1)) for i in range(10)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="max_queue=10"):
        await batcher.submit(["one too many"], 1)
    search.release.set()
    assert len(await asyncio.gather(first, *waiting)) == 11
    await batcher.stop()


async def test_stop_resolves_queued_and_in_flight_requests():
    search = Recorder()
    search.release.clear()
    batcher = make(search, max_wait_s=0)
    tasks = [asyncio.create_task(batcher.submit([f"q{i}"], 1)) for i in range(5)]
    await asyncio.sleep(0.05)
    await batcher.stop()
    search.release.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, BatcherStopped) for r in results)
    with pytest.raises(BatcherStopped):
        await batcher.submit(["late"], 1)


async def test_cancelled_caller_does_not_break_the_batch():
    search = Recorder()
    search.release.clear()
    batcher = make(search, max_wait_s=0)
    first = asyncio.create_task(batcher.submit(["first"], 1))
    await asyncio.sleep(0.05)
    gone = asyncio.create_task(batcher.submit(["gone"], 1))
    stays = asyncio.create_task(batcher.submit(["stays"], 1))
    await asyncio.sleep(0)
    gone.cancel()
    search.release.set()
    assert (await stays)[0][0][0]["id"] == "stays-0"
    await first
    assert ["gone"] not in [q for q, _ in search.calls]
    await batcher.stop()


async def test_metrics_count_batches():
    metrics = Metrics()
    batcher = make(Recorder(), metrics=metrics)
    await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(10)))
    snap = metrics.snapshot()
    assert snap["batches_total"] >= 1 and sum(snap["batch_size_histogram"].values()) == snap["batches_total"]
    assert snap["queue_depth"] == 0
    await batcher.stop()


async def test_direct_runner_runs_each_request_alone():
    search = Recorder()
    runner = DirectRunner(search, threads=4, max_queue=100, metrics=Metrics())
    results = await asyncio.gather(*(runner.submit([f"q{i}"], 2) for i in range(8)))
    assert [r[0][1][0]["id"] for r in results] == [f"q{i}-1" for i in range(8)]
    assert sorted(len(q) for q, _ in search.calls) == [1] * 8
    await runner.stop()
