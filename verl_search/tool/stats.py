"""Per-process counters of each tool of ours (verl's ToolAgentLoop discards tool metrics, so we keep our own):
``STATS`` for search, ``ACCESS_STATS`` for access (its ``queries`` count the urls asked for).

Invariant: recording is O(1) and never raises; latencies are kept in a bounded ring for percentiles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from typing import Any

logger = logging.getLogger(__name__)

_RING = 20_000
_COUNTERS = ("calls", "queries", "requests", "retries", "cache_hits", "coalesced", "invalid_arguments")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


class SearchStats:
    """Counters for calls, queries, HTTP requests, retries, cache hits, failures by kind and call latency."""

    def __init__(self, log_interval: float = 300.0, *, name: str = "search") -> None:
        self._lock = threading.Lock()
        self.log_interval = log_interval
        self.name = name
        self.reset()

    def reset(self) -> None:
        with self._lock:
            for name in _COUNTERS:
                setattr(self, name, 0)
            self.failures: Counter[str] = Counter()
            self._latencies: deque[float] = deque(maxlen=_RING)
            self._last_log = time.monotonic()

    def record_call(self, *, latency_s: float, num_queries: int, failure: str | None) -> None:
        with self._lock:
            self.calls += 1
            self.queries += num_queries
            if failure == "invalid_arguments":
                self.invalid_arguments += 1
            elif failure:
                self.failures[failure] += 1
            self._latencies.append(latency_s)
            due = self.log_interval > 0 and time.monotonic() - self._last_log >= self.log_interval
            if due:
                self._last_log = time.monotonic()
        if due:
            logger.info("%s stats: %s", self.name, self.summary_line())

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, Any]:
        """A plain dict of every counter plus latency p50/p90/p99 in seconds."""
        with self._lock:
            lat = sorted(self._latencies)
            return {
                **{name: getattr(self, name) for name in _COUNTERS},
                "failures": dict(self.failures),
                "failed_calls": sum(self.failures.values()),
                "latency_p50_s": percentile(lat, 50),
                "latency_p90_s": percentile(lat, 90),
                "latency_p99_s": percentile(lat, 99),
            }

    def summary_line(self) -> str:
        s = self.snapshot()
        return (
            f"calls={s['calls']} failed={s['failed_calls']} {s['failures']} invalid_args={s['invalid_arguments']} "
            f"requests={s['requests']} retries={s['retries']} cache_hits={s['cache_hits']} "
            f"coalesced={s['coalesced']} p50={s['latency_p50_s']:.3f}s p99={s['latency_p99_s']:.3f}s"
        )


#: the process-wide counters; read with ``verl_search.search_stats()`` and ``verl_search.access_stats()``
STATS = SearchStats()
ACCESS_STATS = SearchStats(name="access")
