"""The per-request mode (``--no_batching``): each request alone on a thread of a pool, as the public servers do. It
is the reference batching is measured against, not a serving mode; POST /retrieve reaches it as it reaches Batcher.
Invariant: a request past ``max_queue`` queries in flight is refused before any work; every run is counted."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from local_dense_retriever.batcher import SearchFn
from local_dense_retriever.errors import Overloaded, QueryFailed
from local_dense_retriever.metrics import Metrics


class PerRequestRunner:
    """Each request encodes and searches on its own in a thread pool (no batching)."""

    def __init__(self, search: SearchFn, *, threads: int, max_queue: int, metrics: Metrics) -> None:
        self._search = search
        self.max_queue = max_queue
        self._metrics = metrics
        self._inflight, self.threads = 0, threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retriever-request")
        metrics.queue_depth = lambda: self._inflight

    running = True

    def start(self) -> None:
        pass

    def stalled_for(self, now: float) -> float:
        """Always 0: requests run on their own threads, with no queue a worker could stop draining."""
        return 0.0

    def describe_state(self) -> dict:
        return {"in_flight": self._inflight}

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        if self._inflight + len(queries) > self.max_queue:
            raise Overloaded(f"{self._inflight} queries in flight (max_queue={self.max_queue})")
        self._inflight += len(queries)
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, self._search, queries, k)
        except Exception:
            self._metrics.observe_batch(len(queries), failed=True)
            raise
        finally:
            self._inflight -= len(queries)
        self._metrics.observe_batch(len(queries))
        failed = next((r for r in result if isinstance(r, QueryFailed)), None)
        if failed is not None:  # a query failed on its own (web backend): this request fails with it
            raise failed
        return result
