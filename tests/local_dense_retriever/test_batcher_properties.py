"""Property test of the batcher alone: random interleavings of submits, cancellations (with and without the event
loop running the done-callbacks in between), micro-batch completion and failure keep the queue's count equal to
what it holds, never leave the worker spinning, and resolve every caller."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from local_dense_retriever.batcher import Batcher, QueryRejected
from local_dense_retriever.metrics import Metrics

POISON = "boom"


def check_queue(batcher: Batcher) -> None:
    """FairQueue's invariant, read through its internals: ``queued`` and the dead count are what the deque holds,
    each request in it once and marked so."""
    queue = batcher._queue
    held = list(queue._deque)
    assert queue.queued == sum(r.remaining for r in held), queue.state()
    assert queue._dead == sum(1 for r in held if not r.remaining), queue.state()
    assert all(r.in_queue for r in held) and len(set(map(id, held))) == len(held)


def search(queries: list[str], k: int):
    """Answers query q with hits (q, j); any batch holding a poisoned query fails as a whole."""
    if any(POISON in q for q in queries):
        raise RuntimeError("the engine cannot take this text")
    return [[({"id": f"{q}-{j}"}, float(-j)) for j in range(k)] for q in queries]


class BatcherMachine(RuleBasedStateMachine):
    """One batcher on its own event loop, stepped by hand: a rule runs some loop iterations or none at all."""

    @initialize(
        max_batch_size=st.integers(1, 8),
        max_batch_tokens=st.one_of(st.none(), st.integers(1, 12)),
        max_wait_s=st.sampled_from([0.0, 0.002]),
    )
    def start(self, max_batch_size: int, max_batch_tokens: int | None, max_wait_s: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.metrics = Metrics()
        self.batcher = Batcher(
            search,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            cost=lambda q: 1 + len(q) % 4,
            max_wait_s=max_wait_s,
            max_queue=100_000,  # Overloaded is tested elsewhere; here every submit is queued
            metrics=self.metrics,
        )

        async def begin() -> None:
            self.batcher.start()

        self.loop.run_until_complete(begin())
        self.calls: list[tuple[asyncio.Task, list[str], int]] = []
        self.serial = 0

    def _run(self, seconds: float = 0.0) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    @rule(n=st.integers(1, 6), k=st.integers(1, 3), poisoned=st.booleans(), ticks=st.integers(0, 2))
    def submit(self, n: int, k: int, poisoned: bool, ticks: int) -> None:
        self.serial += 1
        queries = [f"r{self.serial}q{i}" + ("x" * (i % 3)) for i in range(n)]
        if poisoned:
            queries[-1] += POISON
        task = self.loop.create_task(self.batcher.submit(queries, k))
        self.calls.append((task, queries, k))
        for _ in range(ticks):
            self._run()

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), ticks=st.integers(0, 2))
    def cancel(self, data, ticks: int) -> None:
        """The caller goes away (a no-op if it was answered already); with 0 ticks the worker may run before the
        future's done-callback does. What is drawn never depends on the engine thread's timing."""
        i = data.draw(st.integers(0, len(self.calls) - 1))
        self.calls[i][0].cancel()
        for _ in range(ticks):
            self._run()

    @rule(ticks=st.integers(1, 4))
    def tick(self, ticks: int) -> None:
        for _ in range(ticks):
            self._run()

    @rule()
    def let_a_batch_finish(self) -> None:
        self._run(0.003)  # the engine thread answers in well under a millisecond

    @invariant()
    def counts_agree_with_the_queue(self) -> None:
        check_queue(self.batcher)
        assert self.metrics.snapshot()["queue_depth"] == self.batcher._queue.queued

    @invariant()
    def resolved_callers_got_their_own_answer(self) -> None:
        for i, (task, queries, k) in enumerate(self.calls):
            if task.done() and not task.cancelled():
                self._check_outcome(i, task, queries, k)

    def _check_outcome(self, i: int, task: asyncio.Task, queries: list[str], k: int) -> None:
        error = task.exception()
        if any(POISON in q for q in queries):
            assert error is not None, "a poisoned request was answered"
        else:
            assert error is None, f"a clean request failed: {error!r}"
            assert [[d["id"] for d, _ in hits] for hits in task.result()] == [
                [f"{q}-{j}" for j in range(k)] for q in queries
            ]

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        try:
            pending = [t for t, _, _ in self.calls if not t.done()]
            if pending:  # every caller is resolved once the loop runs: nothing is lost, nothing waits forever
                done, not_done = self.loop.run_until_complete(asyncio.wait(pending, timeout=10))
                assert not not_done, f"{len(not_done)} callers never resolved"
            for i, (task, queries, k) in enumerate(self.calls):
                if not task.cancelled():
                    self._check_outcome(i, task, queries, k)
                    if isinstance(task.exception(), RuntimeError):  # failed alone in a batch of its own
                        assert any(POISON in q for q in queries)
            self._run()
            check_queue(self.batcher)
            assert self.batcher._queue.queued == 0 and self.batcher.running
            assert self.batcher.stalled_for(self.loop.time()) == 0.0
        finally:
            self.loop.run_until_complete(self.batcher.stop())
            self.loop.close()


BatcherMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_batcher_state_machine = pytest.mark.timeout(300)(BatcherMachine.TestCase)


async def test_a_request_cancelled_as_the_worker_wakes_is_dropped_and_the_worker_waits():
    """The freeze of issue 25: the caller goes away in the same loop iteration its request is queued, so the worker
    meets a done future before its done-callback has run. It must drop the queries, not count them forever."""
    batcher = Batcher(search, max_batch_size=8, max_wait_s=0.0, max_queue=60, metrics=Metrics())
    batcher.start()
    task = asyncio.ensure_future(batcher.submit(["lost"], 1))
    await asyncio.sleep(0)  # queued; the worker is woken
    task.cancel()  # the future is done now; its done-callback runs only after the worker's next pass
    await asyncio.sleep(0.01)  # a spinning worker never gives the loop back: this would hang (pytest-timeout)
    assert batcher._queue.queued == 0 and not batcher._queue._deque
    assert (await batcher.submit(["next"], 1))[0][0][0]["id"] == "next-0"
    await batcher.stop()


def test_query_rejected_is_what_a_poisoned_request_gets_beside_clean_ones():
    """The property test's oracle for failures: in a shared batch only the poisoned request fails (QueryRejected)."""

    async def scenario():
        batcher = Batcher(search, max_batch_size=8, max_wait_s=0.01, max_queue=60, metrics=Metrics())
        batcher.start()
        results = await asyncio.gather(
            batcher.submit(["a", "b"], 1), batcher.submit(["c" + POISON], 1), return_exceptions=True
        )
        await batcher.stop()
        return results

    clean, poisoned = asyncio.run(scenario())
    assert [[d["id"] for d, _ in hits] for hits in clean] == [["a-0"], ["b-0"]]
    assert isinstance(poisoned, QueryRejected)
