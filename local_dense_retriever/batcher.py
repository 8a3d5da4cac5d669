"""Dynamic batching: concurrent requests are coalesced into one engine call run in a worker thread.

Invariant: every submitted request is resolved (result or exception), including when a batch raises, when the
worker task dies, and on shutdown; at most ``max_queue`` queries wait, more are refused with ``Overloaded``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from local_dense_retriever.metrics import Metrics

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], list[list[tuple[dict, float]]]]


class Overloaded(RuntimeError):
    """The queue is full; the caller should retry later (HTTP 429)."""


class BatcherStopped(RuntimeError):
    """The batcher is not running (shutting down, or its worker died)."""


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future


class Batcher:
    """Queue of futures + one worker task; the engine call runs on a single dedicated thread."""

    def __init__(
        self, search: SearchFn, *, max_batch_size: int, max_wait_s: float, max_queue: int, metrics: Metrics
    ) -> None:
        self._search = search
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self._metrics = metrics
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_queries = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-batch")
        metrics.queue_depth = lambda: self._pending_queries

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._worker(), name="retriever-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_pending(BatcherStopped("the retrieval server is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        """Queue ``queries``; resolves with their top-``k`` hits once their batch has run."""
        if self._task is None or self._task.done():
            raise BatcherStopped("the batching worker is not running")
        if self._pending_queries + len(queries) > self.max_queue:
            raise Overloaded(f"{self._pending_queries} queries already queued (max_queue={self.max_queue})")
        item = _Pending(queries, k, asyncio.get_running_loop().create_future())
        self._pending.append(item)
        self._pending_queries += len(queries)
        self._wake.set()
        return await item.future

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending and (not batch or size + len(self._pending[0].queries) <= self.max_batch_size):
            item = self._pending.popleft()
            self._pending_queries -= len(item.queries)
            if item.future.done():  # caller gave up (cancelled) while waiting
                continue
            batch.append(item)
            size += len(item.queries)
        return batch

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        last_size = 1
        try:
            while True:
                while not self._pending:
                    self._wake.clear()
                    await self._wake.wait()
                # Closed-loop callers re-send right after their answers: wait (briefly) until as many queries as
                # the previous batch had are back, so the batch does not split into a large and a small half.
                target = min(self.max_batch_size, last_size)
                deadline = loop.time() + self.max_wait_s
                while self._pending_queries < target and (left := deadline - loop.time()) > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), left)
                    except asyncio.TimeoutError:
                        break
                    self._wake.clear()
                batch = self._take_batch()
                if batch:
                    last_size = sum(len(item.queries) for item in batch)
                    await self._run_batch(loop, batch)
        finally:
            self._fail_pending(BatcherStopped("the batching worker stopped"))

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending]) -> None:
        queries = [q for item in batch for q in item.queries]
        k = max(item.k for item in batch)
        try:
            results = await loop.run_in_executor(self._executor, self._search, queries, k)
            if len(results) != len(queries):
                raise RuntimeError(f"search returned {len(results)} result lists for {len(queries)} queries")
        except Exception as e:
            logger.exception("batch of %d queries failed", len(queries))
            self._resolve_failed(batch, len(queries), e)
            return
        except BaseException:  # cancelled mid-batch (shutdown): still resolve every waiter, then propagate
            self._resolve_failed(batch, len(queries), BatcherStopped("the batching worker stopped mid-batch"))
            raise
        self._metrics.observe_batch(len(queries))
        pos = 0
        for item in batch:
            n = len(item.queries)
            if not item.future.done():
                item.future.set_result([hits[: item.k] for hits in results[pos : pos + n]])
            pos += n

    def _resolve_failed(self, batch: list[_Pending], size: int, error: Exception) -> None:
        self._metrics.observe_batch(size, failed=True)
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)

    def _fail_pending(self, error: Exception) -> None:
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(error)
        self._pending_queries = 0


class DirectRunner:
    """Per-request reference mode: each request encodes and searches on its own in a thread pool (no batching)."""

    def __init__(self, search: SearchFn, *, threads: int, max_queue: int, metrics: Metrics) -> None:
        self._search = search
        self.max_queue = max_queue
        self._metrics = metrics
        self._inflight = 0
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retriever-request")
        metrics.queue_depth = lambda: self._inflight

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
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
        return result
