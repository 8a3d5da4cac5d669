"""A thread that notices a stuck service, tells /health, and makes SIGTERM work even then: the event loop not run for
``loop_block_s``, or queries waiting ``stall_s`` with no micro-batch started or finished, is logged once (with the
loop thread's stack) and answered 503 while it lasts; a SIGTERM the blocked loop cannot act on ends the process after
``exit_grace_s``. Invariant: the thread only reads the service's state, never touches the event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: exit status of a process the watchdog ends after a SIGTERM the blocked event loop could not act on (128 + 15)
FORCED_EXIT_STATUS = 143


class Watchdog:
    """Watches the event loop's heartbeat and the batcher's progress from a daemon thread."""

    def __init__(
        self,
        *,
        stalled_for: Callable[[float], float],
        describe: Callable[[], dict],
        stall_s: float,
        loop_block_s: float,
        exit_grace_s: float = 2.0,
        period_s: float | None = None,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self._stalled_for, self._describe, self._exit = stalled_for, describe, exit
        self.stall_s, self.loop_block_s, self.exit_grace_s = stall_s, loop_block_s, exit_grace_s
        self.period_s = period_s if period_s is not None else min(0.25, loop_block_s / 4, stall_s / 4)
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._heartbeat: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._terminate_at: float | None = None
        self.problem: str | None = None  # read by /health; None while the service is healthy
        self.episodes = 0  # how many times a problem began (each one was logged)

    def start(self) -> None:
        """Start the heartbeat on the running loop and the watching thread."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat_forever(), name="retriever-heartbeat")
        self._thread = threading.Thread(target=self._watch, name="retriever-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def terminate_requested(self) -> None:
        """A SIGTERM/SIGINT arrived (called from the signal handler): if the loop cannot act on it, end the process."""
        if self._terminate_at is None:
            self._terminate_at = time.monotonic()

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self.period_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            self.check(time.monotonic())

    def current_problem(self) -> str | None:
        """What is stuck now, for a health check (run on the event loop's thread, so the loop evidently runs)."""
        watched = self._loop_thread is not None and not self._stop.is_set()  # a heartbeat beats only in between
        on_loop = threading.get_ident() == self._loop_thread
        return self._diagnose(time.monotonic(), loop_running=on_loop or not watched)

    def _diagnose(self, now: float, *, loop_running: bool = False) -> str | None:
        blocked = 0.0 if loop_running else now - self._beat
        if blocked > self.loop_block_s:
            return f"the event loop has not run for {blocked:.1f} s"
        if (stalled := self._stalled_for(now)) > self.stall_s:
            return f"the batching worker has made no progress for {stalled:.1f} s with queries waiting"
        return None

    def check(self, now: float) -> str | None:
        """One look: update ``problem``, log a new episode once, end the process if a SIGTERM cannot be honoured."""
        blocked = now - self._beat
        problem = self._diagnose(now)
        if problem is not None and self.problem is None:
            self.episodes += 1
            logger.error("retriever stuck: %s; state %s; /health answers 503 until it recovers%s",
                         problem, self._state(), self._loop_stack())  # fmt: skip
        elif problem is None and self.problem is not None:
            logger.warning("retriever recovered (was: %s)", self.problem)
        self.problem = problem
        waited = now - self._terminate_at if self._terminate_at is not None else 0.0
        if blocked > self.loop_block_s and waited > self.exit_grace_s:
            logger.critical("exiting: a termination signal came %.1f s ago and the blocked event loop cannot act on "
                            "it (%s)", waited, problem)  # fmt: skip
            logging.shutdown()
            self._exit(FORCED_EXIT_STATUS)
        return problem

    def _state(self) -> dict:
        for _ in range(3):  # the loop thread may mutate the queue while it is read; a stuck one does not
            try:
                return self._describe()
            except RuntimeError:
                continue
        return {"state": "unreadable (changing)"}

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread) if self._loop_thread is not None else None
        if frame is None:
            return ""
        return "; the event loop thread is at:\n" + "".join(traceback.format_stack(frame)[-8:])
