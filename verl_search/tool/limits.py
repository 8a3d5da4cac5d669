"""Per-process admission control: a token-bucket rate limiter and a bounded worker pool, both deadline-aware.

Invariant: a caller never waits past its deadline for a token or a slot; a token taken by a caller that then gives up
is returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from verl_search.errors import DeadlineExceeded

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored; ``acquire`` reserves a token (a negative balance keeps
    waiters FIFO-fair) and sleeps until it is due."""

    def __init__(
        self, rate: float, burst: float | None = None, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep
    ):
        if rate <= 0:
            raise ValueError("rate must be > 0 (use no limiter for unlimited)")
        self.rate = float(rate)
        self.capacity = float(burst) if burst is not None else max(1.0, self.rate)
        self._tokens = self.capacity
        self._clock = clock
        self._sleep = sleep
        self._last = clock()

    def _refill(self, now: float) -> None:
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def reserve(self) -> float:
        """Take one token now; return how long the caller must wait before using it (0 if available)."""
        self._refill(self._clock())
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self) -> None:
        """Give back a reserved token (its holder gave up before using it)."""
        self._tokens = min(self.capacity, self._tokens + 1.0)

    async def acquire(self, deadline: float | None = None) -> None:
        """Wait for a token; raise :class:`DeadlineExceeded` at once if it would only come after ``deadline``."""
        wait = self.reserve()
        if wait <= 0:
            return
        if deadline is not None and self._clock() + wait > deadline:
            self.refund()
            raise DeadlineExceeded(f"rate limit ({self.rate:g}/s) would delay the call past its deadline")
        try:
            await self._sleep(wait)
        except BaseException:
            self.refund()
            raise


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
