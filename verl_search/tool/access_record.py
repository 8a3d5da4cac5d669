"""Per-trajectory access statistics, the keys both loops keep in verl's ``extra_fields`` (they reach the reward's
``extra_info`` and the per-step metrics of ``verl_search.monitor``).

Invariant: ``record_access`` creates every key of ``ACCESS_TRAJECTORY_STATS`` and never raises; the urls a trajectory
opened are kept (at most ``MAX_URLS_KEPT`` distinct ones) so that repeats of the same window are counted exactly.
"""

from __future__ import annotations

from typing import Any, Protocol

#: counters every trajectory that called access carries
ACCESS_TRAJECTORY_STATS = (
    "access_calls",  # every call, valid or not
    "access_failures",  # calls that read no window (invalid arguments included)
    "access_latency_s",  # seconds spent in access calls
    "access_windows_read",  # windows read (successful calls)
    "access_pages_opened",  # distinct urls with at least one window read
    "access_repeats",  # successful reads of a (url, window) this trajectory had read before
)
#: counts of failed calls by kind: ``access_failed_<kind>`` (``invalid_arguments``, ``not_found``, ``timeout``, ...)
ACCESS_FAILED_PREFIX = "access_failed_"
#: the distinct ``url#window`` strings read so far (bounded), which the repeat count is taken from
ACCESS_READ = "access_read"
MAX_URLS_KEPT = 256


class AccessResult(Protocol):
    ok: bool
    failure: str | None
    latency_s: float
    page: int


def record_access(fields: dict[str, Any], outcome: AccessResult, url: str | None) -> None:
    """Add one access call (to ``url``, None when its arguments named none) to a trajectory's ``extra_fields``."""
    for key in ACCESS_TRAJECTORY_STATS:
        fields.setdefault(key, 0)
    fields["access_calls"] += 1
    fields["access_latency_s"] += outcome.latency_s
    if not outcome.ok:
        fields["access_failures"] += 1
        key = ACCESS_FAILED_PREFIX + (outcome.failure or "unknown")
        fields[key] = fields.get(key, 0) + 1
        return
    fields["access_windows_read"] += 1
    read: list[str] = fields.setdefault(ACCESS_READ, [])
    window = f"{url}#{outcome.page}"
    if window in read:
        fields["access_repeats"] += 1
        return
    if not any(seen.rpartition("#")[0] == url for seen in read):
        fields["access_pages_opened"] += 1
    if len(read) < MAX_URLS_KEPT:
        read.append(window)
