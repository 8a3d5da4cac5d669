"""Pacing of calls to a remote service, shared by the search tool and the retriever's web backend: a deadline-aware
token bucket, capped exponential backoff with full jitter and the ``Retry-After`` header.

Invariants: a caller never waits past its deadline for a token, and a token taken by a caller that then gives up is
returned; backoff arithmetic is bounded whatever the attempt number. A shared leaf: it imports nothing of ours.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_MAX_DOUBLINGS = 32  # 2.0 ** 32 times any base is past any cap


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored (default: one second's worth, at least one); ``acquire``
    reserves a token (a negative balance keeps waiters FIFO-fair) and sleeps until it is due, or raises ``late`` (the
    caller's error type) at once when that would be past the caller's deadline."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        late: type[Exception] = TimeoutError,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0 (use no limiter for unlimited)")
        self.rate = float(rate)
        self.capacity = float(burst) if burst is not None else max(1.0, self.rate)
        self._tokens = self.capacity
        self._late, self._clock, self._sleep = late, clock, sleep
        self._last = clock()

    def reserve(self) -> float:
        """Take one token now; return how long the caller must wait before using it (0 if available)."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate) - 1.0
        self._last = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self) -> None:
        """Give back a reserved token (its holder gave up before using it)."""
        self._tokens = min(self.capacity, self._tokens + 1.0)

    async def acquire(self, deadline: float | None = None) -> None:
        """Wait for a token; raise ``late`` at once if it would only come after ``deadline`` (clock time)."""
        wait = self.reserve()
        if wait <= 0:
            return
        if deadline is not None and self._clock() + wait > deadline:
            self.refund()
            raise self._late(f"the rate limit of {self.rate:g} calls/s leaves no slot before the deadline")
        try:
            await self._sleep(wait)
        except BaseException:
            self.refund()
            raise


def doubling_seconds(attempt: int, base: float, cap: float) -> float:
    """``base * 2 ** (attempt - 1)`` capped at ``cap``, for any ``attempt`` (never overflows)."""
    return min(cap, base * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))


def backoff_seconds(attempt: int, base: float, cap: float, at_least: float | None = None) -> float:
    """Seconds before attempt ``attempt + 1``: full jitter over ``doubling_seconds(attempt, base, cap)``, and at least
    ``at_least`` (what the service asked for in ``Retry-After``, as far as the caller honours it)."""
    return max(random.uniform(0, doubling_seconds(attempt, base, cap)), at_least or 0.0)


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header given in seconds; None when absent or an HTTP date (backoff applies then)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
