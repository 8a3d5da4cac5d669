"""Dynamic batching: concurrent requests are served in shared micro-batches, round-robin (``FairQueue``), run in one
worker thread. Invariants: every request is resolved, also when a batch raises, the worker dies or the server stops;
at most ``max_queue`` queries wait (else ``Overloaded``); a failing batch is retried request by request, so only the
culprit fails; a query the engine answers with its ``QueryFailed`` fails its own request only; queries of callers
that went away are never computed; every pass of the worker takes a batch or awaits. The runners without batches
(``--no_batching``, the web backend) are in ``request_runners``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from local_dense_retriever.errors import BatcherStopped, Overloaded, QueryFailed, QueryRejected
from local_dense_retriever.fair_queue import FairQueue, Request, Slice
from local_dense_retriever.metrics import Metrics

logger = logging.getLogger(__name__)

#: the engine's search: (queries, k) -> per query, (document, score) pairs, best first
SearchFn = Callable[[list[str], int], list[list[tuple[dict, float]]]]


def estimate_tokens(text: str, *, cap: int) -> int:
    """An estimate of the tokens ``text`` costs the encoder: ~3 characters per token, at most ``cap`` (truncation)."""
    return min(cap, 2 + len(text) // 3)


#: the longest wait for a merged batch, as a share of the last batch's engine time (``WaitPlan``)
MERGE_WAIT_SHARE = 0.05


@dataclass(frozen=True)
class WaitPlan:
    """What the worker waits for before the next batch, within ``max_wait_s``: ``size`` queries (the last batch's:
    closed-loop callers come back), then ``merged`` (plus those that arrived while it ran: cohorts merge again) until
    ``merge_until`` (open-loop callers do not come back). After a batch that left a backlog, nothing."""

    size: int
    merged: int
    merge_until: float


class Batcher:
    """Round-robin queue of requests + one worker task; the engine call runs on a single dedicated thread."""

    def __init__(
        self,
        search: SearchFn,
        *,
        max_batch_size: int,
        max_wait_s: float,
        max_queue: int,
        metrics: Metrics,
        max_batch_tokens: int | None = None,
        cost: Callable[[str], int] | None = None,
    ) -> None:
        self._search = search
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self._cost = cost or (lambda _q: 1)
        self._metrics = metrics
        self._queue = FairQueue()  # the one owner of the waiting requests and of their query count
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-batch")
        self._last_progress = time.monotonic()  # a batch taken or finished, or the queue newly non-empty
        self._resyncs = 0

    @property
    def running(self) -> bool:
        """Whether the worker takes requests (a Serve health check restarts a replica whose worker has died)."""
        return self._task is not None and not self._task.done()

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
        """Queue ``queries``; resolves with their top-``k`` hits once all their micro-batches have run."""
        if self._task is None or self._task.done():
            raise BatcherStopped("the batching worker is not running")
        if not queries:
            return []
        queued = self._queue.queued
        if queued + len(queries) > self.max_queue:
            raise Overloaded(f"{queued} queries already queued (max_queue={self.max_queue})")
        future = asyncio.get_running_loop().create_future()
        req = Request(queries, k, future, [self._cost(q) for q in queries], [None] * len(queries))
        # resolved, failed or cancelled (the caller went away): its queries still waiting are never computed
        future.add_done_callback(lambda _f, req=req: self._discard(req))
        if not queued:
            self._last_progress = time.monotonic()  # the stall clock starts when work arrives, not at the last batch
        self._queue.push(req)
        self._metrics.set_queue_depth(self._queue.queued)
        self._wake.set()
        return await future

    def stalled_for(self, now: float) -> float:
        """Seconds without progress while queries wait (0 when idle or moving); read by the watchdog's thread."""
        if not self._queue.queued:
            return 0.0
        return max(0.0, now - self._last_progress)

    def describe_state(self) -> dict:
        """The worker's state, for a watchdog's log line."""
        return {**self._queue.state(), "running": self.running, "resyncs": self._resyncs}

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        plan = WaitPlan(1, 1, 0.0)
        batch: list[Slice] = []
        try:
            while True:  # every pass takes a batch or awaits: it never spins
                if not self._queue.queued:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                deadline = loop.time() + self.max_wait_s
                await self._wait_until(loop, plan.size, deadline)
                await self._wait_until(loop, plan.merged, min(deadline, plan.merge_until))
                batch = self._queue.take(self.max_batch_size, self.max_batch_tokens)
                self._metrics.set_queue_depth(self._queue.queued)
                if not batch:  # only when nothing is queued (FairQueue's invariant); never loop on a stale count
                    if self._queue.queued:
                        self._resyncs += 1
                        state = self._queue.state()
                        logger.error("queue count disagreed with the queue (a bug): %s; re-derived it", state)
                        self._queue.resync()
                        self._metrics.set_queue_depth(self._queue.queued)
                    continue
                self._last_progress = time.monotonic()
                backlog = self._queue.queued  # left behind by the size or token cap
                started = loop.time()
                await self._run_batch(loop, batch)
                plan = self._plan_wait(sum(s.hi - s.lo for s in batch), backlog, started, loop.time())
                batch = []
                self._last_progress = time.monotonic()
        finally:
            for s in batch:  # the worker died mid-batch: its callers are answered too
                self._fail(s.req, BatcherStopped("the batching worker stopped mid-batch"))
            self._fail_pending(BatcherStopped("the batching worker stopped"))

    async def _wait_until(self, loop: asyncio.AbstractEventLoop, size: int, until: float) -> None:
        """Until ``size`` queries are queued or the loop's clock reaches ``until``."""
        while self._queue.queued < size and (left := until - loop.time()) > 0:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except asyncio.TimeoutError:
                return

    def _plan_wait(self, size: int, backlog: int, started: float, ended: float) -> WaitPlan:
        """What the next batch waits for, after one of ``size`` queries ran, leaving ``backlog`` queued."""
        if backlog:  # the engine is the bottleneck: take the next batch at once
            return WaitPlan(0, 0, ended)
        arrived = self._queue.queued
        merged = min(self.max_batch_size, size + arrived)
        return WaitPlan(size, merged, ended + MERGE_WAIT_SHARE * (ended - started))  # size: at most max_batch_size

    async def _call(self, loop: asyncio.AbstractEventLoop, slices: list[Slice]) -> list:
        queries = [q for s in slices for q in s.req.queries[s.lo : s.hi]]
        results = await loop.run_in_executor(self._executor, self._search, queries, max(s.req.k for s in slices))
        if len(results) != len(queries):
            raise RuntimeError(f"search returned {len(results)} result lists for {len(queries)} queries")
        return results

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[Slice]) -> None:
        """One micro-batch; cancelled mid-batch (shutdown), its waiters are resolved by the worker's ``finally``."""
        size = sum(s.hi - s.lo for s in batch)
        try:
            results = await self._call(loop, batch)
        except Exception as e:
            if len(batch) == 1:
                logger.error("batch of %d queries failed: %s: %s", size, type(e).__name__, e)
                self._metrics.observe_batch(size, failed=True)
                self._fail(batch[0].req, e)
                return
            logger.warning("batch of %d queries from %d requests failed (%s); retrying request by request",
                           size, len(batch), type(e).__name__)  # fmt: skip
            await self._isolate(loop, batch)
            return
        self._metrics.observe_batch(size)
        self._deliver(batch, results)

    async def _isolate(self, loop: asyncio.AbstractEventLoop, batch: list[Slice]) -> None:
        """Run each request's part alone: the ones that still fail are the culprits (if any part succeeds)."""
        failures: list[tuple[Slice, Exception]] = []
        answered = 0
        for s in batch:
            if s.req.future.done():
                continue
            try:
                results = await self._call(loop, [s])
            except Exception as e:
                failures.append((s, e))
                continue
            answered += 1
            self._metrics.observe_batch(s.hi - s.lo)
            self._deliver([s], results)
        for s, e in failures:
            self._metrics.observe_batch(s.hi - s.lo, failed=True)
            if answered:  # its batch-mates were answered alone: this request's text is what breaks the engine
                logger.warning("request rejected: its %d queries make the engine fail (%s: %s)",
                               s.hi - s.lo, type(e).__name__, e)  # fmt: skip
                self._fail(s.req, QueryRejected(f"the encoder cannot process this request's text ({type(e).__name__})"))
            else:
                logger.error("batch of %d queries failed: %s: %s", s.hi - s.lo, type(e).__name__, e)
                self._fail(s.req, e)

    def _deliver(self, batch: list[Slice], results: list) -> None:
        pos = 0
        for s in batch:
            n = s.hi - s.lo
            req = s.req
            failed = next((r for r in results[pos : pos + n] if isinstance(r, QueryFailed)), None)
            if failed is not None:  # a query of this request failed on its own: only this request fails
                self._fail(req, failed)
            elif not req.future.done():
                req.results[s.lo : s.hi] = [hits[: req.k] for hits in results[pos : pos + n]]
                req.answered += n
                if req.answered == len(req.queries):
                    req.future.set_result(req.results)
            pos += n

    def _fail(self, req: Request, error: BaseException) -> None:
        if not req.future.done():
            req.future.set_exception(error)
        self._discard(req)  # its queries still waiting are not computed

    def _discard(self, req: Request) -> None:
        self._queue.discard(req)
        self._metrics.set_queue_depth(self._queue.queued)

    def _fail_pending(self, error: Exception) -> None:
        self._queue.clear(lambda req: self._fail(req, error))
        self._metrics.set_queue_depth(self._queue.queued)
