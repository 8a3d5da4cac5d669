"""Endpoint selection: fewest requests in flight among healthy endpoints; failing ones are ejected and re-probed.

Invariants: ``pick`` always returns an endpoint (when all are ejected, the one recovering first). One outage counts
once: failures of requests sent before the ejection, or ending inside its window, do not lengthen it. Each endpoint
logs only its state changes, never each failed call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_MAX_DOUBLINGS = 32  # 2.0 ** 32 times eject_seconds is past any cap


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


def ejection_seconds(failures: int, base: float, cap: float) -> float:
    """``base * 2 ** (failures - 1)`` capped at ``cap``, for any ``failures`` ≥ 1 (never overflows)."""
    exponent = min(max(failures - 1, 0), _MAX_DOUBLINGS)
    return min(cap, base * 2.0**exponent)


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
        backoff = ejection_seconds(ep.consecutive_failures, self.eject_seconds, self.eject_max_seconds)
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
