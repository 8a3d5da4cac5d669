"""Batcher: concurrent requests share engine calls, each caller gets its own results, and no waiter is ever left."""

from __future__ import annotations

import asyncio
import threading

import pytest

from local_dense_retriever.batcher import Batcher, BatcherStopped, Overloaded, QueryRejected
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
    batcher = make(lambda queries, k: [[]] * (len(queries) + 1))
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


async def test_a_query_that_breaks_the_engine_fails_only_its_own_request():
    """Like a tokenizer raising on a lone surrogate: the batch is retried request by request, batch-mates answered."""

    class Fragile(Recorder):
        def __call__(self, queries, k):
            if any("\ud800" in q for q in queries):
                self.release.wait(10)
                self.calls.append((list(queries), k))
                raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
            return super().__call__(queries, k)

    search = Fragile()
    search.release.clear()
    batcher = make(search, max_wait_s=0)
    first = asyncio.create_task(batcher.submit(["first"], 1))
    await asyncio.sleep(0.05)  # the first batch is in the engine: the next requests queue up together
    tasks = [asyncio.create_task(batcher.submit([f"q{i}", "bad \ud800" if i == 3 else f"r{i}"], 1)) for i in range(6)]
    await asyncio.sleep(0)
    search.release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await first
    assert isinstance(results[3], QueryRejected) and "TypeError" in str(results[3])
    for i, res in enumerate(results):
        if i != 3:
            assert [hits[0][0]["id"] for hits in res] == [f"q{i}-0", f"r{i}-0"]
    assert any(len(q) == 12 for q, _ in search.calls)  # they did share one batch before it was split
    await batcher.stop()


async def test_a_large_request_is_split_and_does_not_hold_up_small_ones():
    """A whole rollout turn (2,560 queries) in one request, and single-query requests arriving while it runs:
    each small request is answered within a couple of micro-batches, long before the large one completes."""
    calls: list[list[str]] = []
    gate = asyncio.Queue()

    def search(queries, k):
        calls.append(list(queries))
        return [[({"id": q, "contents": q}, 0.0)] for q in queries]

    batcher = make(search, max_batch_size=64, max_wait_s=0, max_queue=10_000)
    done_order: list[str] = []

    async def tracked(name: str, queries: list[str]):
        res = await batcher.submit(queries, 1)
        done_order.append(name)
        await gate.put(name)
        return res

    big = asyncio.create_task(tracked("big", [f"b{i}" for i in range(2560)]))
    while not calls and not big.done():
        await asyncio.sleep(0)
    small = []
    for i in range(10):  # a stream of small requests while the big one is being served
        calls_before = len(calls)
        small.append(asyncio.create_task(tracked(f"s{i}", [f"s{i}"])))
        while (await gate.get()) != f"s{i}":
            pass
        # engine calls seen meanwhile: the one in flight when it arrived, its own, and one the worker may have
        # started before this coroutine woke up. Without fairness it would wait for the rest of the big request.
        assert len(calls) - calls_before <= 3, "a single-query request waited for more than about one micro-batch"
    big_result = await big
    assert done_order[-1] == "big" and set(done_order[:-1]) == {f"s{i}" for i in range(10)}
    assert [hits[0][0]["id"] for hits in big_result] == [f"b{i}" for i in range(2560)]  # in order, all answered
    assert max(len(c) for c in calls) <= 64 and len(calls) >= 2560 // 64
    await batcher.stop()


async def test_micro_batches_are_bounded_in_tokens():
    search = Recorder()
    batcher = make(search, max_batch_size=64, max_batch_tokens=1000, cost=len, max_wait_s=0)
    long, short = "x" * 400, "y"
    await asyncio.gather(batcher.submit([long] * 8, 1), batcher.submit([short] * 8, 1))
    for queries, _ in search.calls:
        assert sum(len(q) for q in queries) <= 1000 or len(queries) == 1
    assert len(search.calls) >= 4
    await batcher.stop()


async def test_cancelled_callers_leave_the_queue_at_once_and_are_never_computed():
    search = Recorder()
    search.release.clear()
    metrics = Metrics()
    batcher = make(search, max_wait_s=0, metrics=metrics, max_queue=100)
    first = asyncio.create_task(batcher.submit(["first"], 1))
    await asyncio.sleep(0.05)
    gone = [asyncio.create_task(batcher.submit([f"gone{i}"] * 10, 1)) for i in range(9)]
    await asyncio.sleep(0)
    assert metrics.snapshot()["queue_depth"] == 90
    for t in gone:
        t.cancel()
    await asyncio.sleep(0)
    assert metrics.snapshot()["queue_depth"] == 0  # room for new work right away (no 429 for dead clients)
    stays = asyncio.create_task(batcher.submit(["stays"] * 100, 1))  # the whole queue is free again
    await asyncio.sleep(0)
    search.release.set()
    assert len(await stays) == 100
    await first
    assert not any(q.startswith("gone") for queries, _ in search.calls for q in queries)
    await batcher.stop()


async def test_the_queue_stays_bounded_when_clients_come_and_go_while_the_engine_is_busy():
    """Thousands of callers that submit and hang up while one engine call runs: neither the queue count nor the
    request list keeps them."""
    search = Recorder()
    search.release.clear()
    metrics = Metrics()
    batcher = make(search, max_wait_s=0, metrics=metrics, max_queue=50)
    first = asyncio.create_task(batcher.submit(["first"], 1))
    await asyncio.sleep(0.05)
    for wave in range(100):
        gone = [asyncio.create_task(batcher.submit([f"gone{wave}-{i}"] * 5, 1)) for i in range(10)]
        await asyncio.sleep(0)
        for t in gone:
            t.cancel()
        await asyncio.sleep(0)
        assert len(batcher._queue._deque) <= 200 and metrics.snapshot()["queue_depth"] == 0
    search.release.set()
    await first
    assert len(search.calls) == 1
    await batcher.stop()


def test_metrics_hold_a_fixed_window_whatever_the_traffic():
    metrics = Metrics(window=500)
    for i in range(20_000):
        metrics.observe_queries(1 + i % 2560)
        metrics.observe_request(200 if i % 7 else 429, 0.001 * (i % 13), None if i % 7 else "overloaded")
        metrics.observe_batch(1 + i % 256, failed=i % 100 == 0)
    snap = metrics.snapshot()
    assert snap["latency_ms"]["window"] == 500 and len(metrics._latencies) == 500
    assert len(snap["batch_size_histogram"]) <= 9 and len(snap["responses_by_status"]) == 2
    assert snap["requests_total"] == 20_000


class Slow(Recorder):
    """An engine call that takes ``seconds``, as a real encoder + index scan does."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def __call__(self, queries, k):
        threading.Event().wait(self.seconds)
        return super().__call__(queries, k)


async def test_closed_loop_clients_that_start_in_two_waves_are_served_in_one_batch():
    """Clients that re-send as soon as they are answered, the second half starting while the first half's batch runs:
    the batcher must merge them into one batch, not serve two cohorts in turn (each paying a whole index scan)."""
    search = Slow(0.2)  # the merge waits a share of this for the answered callers to come back
    batcher = make(search, max_wait_s=0.5)
    stop = False

    async def client(i: int) -> None:
        n = 0
        while not stop:
            assert (await batcher.submit([f"c{i}-{n}"], 1))[0][0][0]["id"] == f"c{i}-{n}-0"
            n += 1

    first = [asyncio.create_task(client(i)) for i in range(4)]
    while not search.calls and search.release.is_set():  # the first wave's batch has run
        await asyncio.sleep(0.001)
    second = [asyncio.create_task(client(i)) for i in range(4, 8)]
    while len(search.calls) < 8:
        await asyncio.sleep(0.01)
    stop = True
    await asyncio.wait_for(asyncio.gather(*first, *second), 5)
    await batcher.stop()
    sizes = [len(q) for q, _ in search.calls]
    assert sizes[-4:] == [8] * 4, sizes


async def test_a_backlog_is_served_without_waiting_for_more():
    """When the size cap leaves queries queued, the engine is the bottleneck: the next batch goes at once, even with
    a long max_wait and fewer queued than the last batch had."""
    search = Recorder()
    search.release.clear()
    batcher = make(search, max_batch_size=4, max_wait_s=30)
    first = asyncio.create_task(batcher.submit(["blocker"], 1))
    await asyncio.sleep(0.05)
    rest = asyncio.create_task(batcher.submit([f"q{i}" for i in range(6)], 1))  # 4, then a backlog of 2
    await asyncio.sleep(0)
    search.release.set()
    results = await asyncio.wait_for(asyncio.gather(first, rest), 5)  # a 30 s wait would time out here
    assert [hits[0][0]["id"] for hits in results[1]] == [f"q{i}-0" for i in range(6)]
    assert [len(q) for q, _ in search.calls] == [1, 4, 2]
    await batcher.stop()
