"""The per-request reference mode (--no_batching): each request runs alone, and the queue bound still holds."""

from __future__ import annotations

import asyncio
import threading

import pytest

from local_dense_retriever.errors import Overloaded
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.request_runners import PerRequestRunner


def search(queries: list[str], k: int):
    return [[({"id": f"{q}-{j}", "contents": q}, float(-j)) for j in range(k)] for q in queries]


async def test_each_request_runs_alone_and_is_counted():
    calls = []
    metrics = Metrics()
    runner = PerRequestRunner(lambda q, k: calls.append(len(q)) or search(q, k), threads=4, max_queue=100,
                              metrics=metrics)  # fmt: skip
    results = await asyncio.gather(*(runner.submit([f"q{i}"], 2) for i in range(8)))
    assert [r[0][1][0]["id"] for r in results] == [f"q{i}-1" for i in range(8)]
    assert calls == [1] * 8 and metrics.snapshot()["batches_total"] == 8
    await runner.stop()


async def test_requests_past_max_queue_are_refused_before_any_work():
    gate = threading.Event()
    runner = PerRequestRunner(lambda q, k: gate.wait(10) and search(q, k), threads=2, max_queue=3, metrics=Metrics())
    first = asyncio.create_task(runner.submit(["a", "b"], 1))
    await asyncio.sleep(0.05)
    with pytest.raises(Overloaded, match="2 queries in flight"):
        await runner.submit(["c", "d"], 1)
    gate.set()
    assert len(await first) == 2
    await runner.stop()
