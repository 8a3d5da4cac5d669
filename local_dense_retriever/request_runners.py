"""The runners without micro-batches: each request is served on its own. ``PerRequestRunner`` (``--no_batching``, the
reference batching is measured against) encodes and searches each request on a pool thread; ``DocumentRunner`` (the
web backend, whatever ``--batching`` says) has each request await its own queries on the event loop, so a slow or
hanging live call delays only the requests holding its query and a cache hit is answered at once.

Invariants: at most ``max_queue`` queries are in flight (past it a request is refused with ``Overloaded`` before any
work); a query the engine answers with its ``QueryFailed`` fails its own request only; no queue exists that a worker
could stop draining.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from local_dense_retriever.errors import Overloaded, QueryFailed

if TYPE_CHECKING:
    from local_dense_retriever.batcher import SearchFn
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.metrics import Metrics

Results = list[list[tuple[dict, float]] | QueryFailed]


class InFlightRunner:
    """What both runners share: the in-flight count, admission, metrics and a failed query failing its request."""

    running = True

    def __init__(self, *, max_queue: int, metrics: Metrics) -> None:
        self.max_queue, self._metrics = max_queue, metrics
        self._inflight = 0

    def start(self) -> None:
        pass

    def stalled_for(self, now: float) -> float:
        """Always 0: each request runs on its own, with no queue a worker could stop draining."""
        return 0.0

    def describe_state(self) -> dict:
        return {"in_flight": self._inflight}

    async def _run(self, queries: list[str], k: int) -> Results:
        raise NotImplementedError

    async def submit(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        if self._inflight + len(queries) > self.max_queue:
            raise Overloaded(f"{self._inflight} queries in flight (max_queue={self.max_queue})")
        self._inflight += len(queries)
        self._metrics.set_queue_depth(self._inflight)
        try:
            results = await self._run(queries, k)
        except Exception:
            self._metrics.observe_batch(len(queries), failed=True)
            raise
        finally:
            self._inflight -= len(queries)
            self._metrics.set_queue_depth(self._inflight)
        self._metrics.observe_batch(len(queries))
        failed = next((r for r in results if isinstance(r, QueryFailed)), None)
        if failed is not None:  # a query failed on its own (web backend): this request fails with it
            raise failed
        return results


class PerRequestRunner(InFlightRunner):
    """Each request encodes and searches on its own in a thread pool, as the public servers do."""

    def __init__(self, search: SearchFn, *, threads: int, max_queue: int, metrics: Metrics) -> None:
        super().__init__(max_queue=max_queue, metrics=metrics)
        self._search, self.threads = search, threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retriever-request")

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, queries: list[str], k: int) -> Results:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._search, queries, k)


class DocumentRunner(InFlightRunner):
    """The runner of ``--backend web``: each request awaits its own queries; the rerank stage, if any, runs on one
    thread of its own, never on the event loop."""

    def __init__(self, engine: RetrievalEngine, *, max_queue: int, metrics: Metrics) -> None:
        super().__init__(max_queue=max_queue, metrics=metrics)
        self._engine = engine
        self._rerank_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-rerank")

    async def stop(self) -> None:
        self._rerank_pool.shutdown(wait=False, cancel_futures=True)

    async def _rerank(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._rerank_pool, fn, *args)

    async def _run(self, queries: list[str], k: int) -> Results:
        results = await self._engine.search_documents(queries, k, rerank=self._rerank)
        return [r if isinstance(r, QueryFailed) else r[:k] for r in results]
