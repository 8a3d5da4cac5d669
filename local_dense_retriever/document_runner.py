"""DocumentRunner: serves a document backend (web) request by request on the event loop, each request awaiting its
own queries, so a slow or hanging live call delays only the requests holding its query and a cache hit is answered
at once. Invariants: at most ``max_queue`` queries are in flight (else ``Overloaded``); a query the backend failed
fails its own request only; the rerank stage, if any, runs on one thread of its own, never on the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from local_dense_retriever.errors import Overloaded, QueryFailed

if TYPE_CHECKING:
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.metrics import Metrics


class DocumentRunner:
    """The runner of ``--backend web`` (whatever ``--batching`` says): no micro-batches, no worker to stall."""

    running = True

    def __init__(self, engine: RetrievalEngine, *, max_queue: int, metrics: Metrics) -> None:
        self._engine, self.max_queue, self._metrics = engine, max_queue, metrics
        self._inflight = 0
        self._rerank_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-rerank")
        metrics.queue_depth = lambda: self._inflight

    def start(self) -> None:
        pass

    def stalled_for(self, now: float) -> float:
        """Always 0: each request awaits its own calls; there is no queue a worker could stop draining."""
        return 0.0

    def describe_state(self) -> dict:
        return {"in_flight": self._inflight}

    async def stop(self) -> None:
        self._rerank_pool.shutdown(wait=False, cancel_futures=True)

    async def _rerank(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._rerank_pool, fn, *args)

    async def submit(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        if self._inflight + len(queries) > self.max_queue:
            raise Overloaded(f"{self._inflight} queries in flight (max_queue={self.max_queue})")
        self._inflight += len(queries)
        try:
            results = await self._engine.search_documents(queries, k, rerank=self._rerank)
        except Exception:
            self._metrics.observe_batch(len(queries), failed=True)
            raise
        finally:
            self._inflight -= len(queries)
        self._metrics.observe_batch(len(queries))
        failed = next((r for r in results if isinstance(r, QueryFailed)), None)
        if failed is not None:
            raise failed
        return [hits[:k] for hits in results]
