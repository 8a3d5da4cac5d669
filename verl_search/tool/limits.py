"""Where and when a request may go: a bounded, deadline-aware worker pool and endpoint selection (fewest requests in
flight among healthy endpoints; failing ones are ejected and re-probed). The rate limiter is ``verl_search.pacing``'s.

Invariants: a caller never waits past its deadline for a slot. ``pick`` always returns an endpoint (when all are
ejected, the one recovering first). One outage counts once: failures of requests sent before the ejection, or ending
inside its window, do not lengthen it. Each endpoint logs only its state changes, never each failed call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from verl_search.errors import DeadlineExceeded
from verl_search.pacing import Clock, doubling_seconds

logger = logging.getLogger(__name__)


class WorkerPool:
    """At most ``size`` requests in flight in this process; waiting for a slot honours the caller's deadline."""

    def __init__(self, size: int, *, clock: Clock = time.monotonic):
        self.size = size
        self._sem = asyncio.Semaphore(size)
        self._clock = clock
        self.in_flight = 0
        self.waiting = 0

    @asynccontextmanager
    async def slot(self, deadline: float) -> AsyncIterator[None]:
        if self._sem.locked() or self.waiting:
            self.waiting += 1
            try:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise DeadlineExceeded("no worker slot free before the deadline")
                try:
                    await asyncio.wait_for(self._sem.acquire(), remaining)
                except asyncio.TimeoutError as e:
                    raise DeadlineExceeded(f"all {self.size} workers busy until the deadline") from e
            finally:
                self.waiting -= 1
        else:
            await self._sem.acquire()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._sem.release()


@dataclass
class Endpoint:
    url: str
    in_flight: int = 0
    consecutive_failures: int = 0  # failed re-probes of the current outage (0 while healthy)
    ejected_at: float = float("-inf")
    ejected_until: float = 0.0
    ejections: int = 0  # outages seen
    wire: str | None = None  # the wire form it was found to speak, None until known

    @property
    def down(self) -> bool:
        return self.consecutive_failures > 0


class EndpointSet:
    def __init__(self, urls: Sequence[str], *, eject_seconds: float, eject_max_seconds: float) -> None:
        if not urls:
            raise ValueError("at least one endpoint is needed")
        self.endpoints = [Endpoint(u) for u in urls]
        self.eject_seconds = eject_seconds
        self.eject_max_seconds = eject_max_seconds
        self._turn = 0

    def pick(self, now: float) -> Endpoint:
        """The healthy endpoint with the fewest requests in flight (ties rotate), else the soonest to recover."""
        n = len(self.endpoints)
        if n == 1:
            return self.endpoints[0]
        self._turn = (self._turn + 1) % n
        best: Endpoint | None = None
        for i in range(n):
            ep = self.endpoints[(self._turn + i) % n]
            if ep.ejected_until <= now and (best is None or ep.in_flight < best.in_flight):
                best = ep
        if best is not None:
            return best
        return min(self.endpoints, key=lambda ep: ep.ejected_until)

    def failed(self, ep: Endpoint, now: float, started: float | None = None) -> bool:
        """Record a failure of a request to ``ep`` sent at ``started`` (default ``now``); True if it counted (a failed
        re-probe, which doubles the ejection up to the cap)."""
        started = now if started is None else started
        if now < ep.ejected_until or started < ep.ejected_at:
            return False
        ep.consecutive_failures += 1
        backoff = doubling_seconds(ep.consecutive_failures, self.eject_seconds, self.eject_max_seconds)
        ep.ejected_at = now
        ep.ejected_until = now + backoff
        if ep.consecutive_failures == 1:
            ep.ejections += 1
            logger.warning("retrieval endpoint %s is failing; skipped, re-probed in %.3g s", ep.url, backoff)
        else:
            logger.debug("retrieval endpoint %s still failing; next re-probe in %.3g s", ep.url, backoff)
        return True

    def succeeded(self, ep: Endpoint) -> None:
        if ep.down:
            logger.warning("retrieval endpoint %s answers again", ep.url)
        ep.consecutive_failures = 0
        ep.ejected_until = 0.0
