"""The page access of one training step's rollouts as flat ``access/...`` metrics, from the per-trajectory keys of
:mod:`verl_search.tool.access_record` in each trajectory's ``extra_fields``.

Invariant: pure and total, as the search metrics. A step where no trajectory carries those keys (a run without access,
an empty step) gives no access metric at all. Where some do, a trajectory of our loops without them (it carries the
search stats or the reward's search count) never called access and counts as 0 pages; any other row is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_search.monitor.values import mean, nearest_rank, number
from verl_search.tool.access_record import ACCESS_FAILED_PREFIX, ACCESS_TRAJECTORY_STATS

#: a trajectory's access counters (None: the row holds no number there)
Counts = dict[str, float | None]


def _counts(row: Mapping[str, Any], reward: Mapping[str, Any]) -> Counts | None:
    """The access counters of one row: its own, zeros for a trajectory of our loops that never called access, else
    None (not one of ours)."""
    if "access_calls" in row:
        return {key: number(row.get(key)) for key in ACCESS_TRAJECTORY_STATS}
    if number(row.get("search_calls", reward.get("num_searches"))) is not None:
        return dict.fromkeys(ACCESS_TRAJECTORY_STATS, 0.0)
    return None


def access_step_metrics(rows: list[Mapping[str, Any]], rewards: list[Mapping[str, Any]]) -> dict[str, float]:
    """``access/*`` metrics of one step's trajectories: ``rows`` their ``extra_fields``, ``rewards`` (aligned) their
    reward's extra keys."""
    accessed = [r for r in rows if "access_calls" in r]
    if not accessed:
        return {}
    counts = [c for row, reward in zip(rows, rewards, strict=True) if (c := _counts(row, reward)) is not None]

    def column(key: str) -> list[float]:
        return [v for c in counts if (v := c[key]) is not None]

    out: dict[str, float] = {}
    if pages := column("access_pages_opened"):
        out["access/pages_per_traj/mean"] = mean(pages)
        out["access/pages_per_traj/max"] = max(pages)
        out["access/pages_per_traj/share_0"] = sum(p == 0 for p in pages) / len(pages)
    if windows := column("access_windows_read"):
        out["access/windows_per_traj/mean"] = mean(windows)
        out["access/windows_per_traj/max"] = max(windows)
        out["access/windows_read"] = sum(windows)
    if calls := column("access_calls"):
        out["access/calls_per_traj/mean"] = mean(calls)
    out.update(_repeats(counts))
    out.update(_failures(accessed, counts))
    out.update(_latency(counts))
    return out


def _pairs(counts: list[Counts], a: str, b: str) -> list[tuple[float, float]]:
    return [(x, y) for c in counts if (x := c[a]) is not None and (y := c[b]) is not None]


def _repeats(counts: list[Counts]) -> dict[str, float]:
    """Re-reads of a window the trajectory had read before: their share of the step's windows read, and the most
    in one trajectory (a model reading the same page over and over)."""
    pairs = _pairs(counts, "access_repeats", "access_windows_read")
    if not pairs:
        return {}
    return {
        "access/repeat_share": sum(r for r, _ in pairs) / max(sum(w for _, w in pairs), 1.0),
        "access/repeats_per_traj/max": max(r for r, _ in pairs),
    }


def _failures(accessed: list[Mapping[str, Any]], counts: list[Counts]) -> dict[str, float]:
    """Failed calls: their share of the calls, and their count by kind."""
    out: dict[str, float] = {}
    if pairs := _pairs(counts, "access_failures", "access_calls"):
        out["access/failed_share"] = sum(f for f, _ in pairs) / max(sum(c for _, c in pairs), 1.0)
    kinds = sorted({k for r in accessed for k in r if isinstance(k, str) and k.startswith(ACCESS_FAILED_PREFIX)})
    for key in kinds:
        out[f"access/failed/{key.removeprefix(ACCESS_FAILED_PREFIX)}"] = sum(
            v for r in accessed if (v := number(r.get(key))) is not None
        )
    return out


def _latency(counts: list[Counts]) -> dict[str, float]:
    """Seconds in access calls: per call (the mean), and per trajectory that called (its total, p50 and p99)."""
    pairs = [(s, c) for s, c in _pairs(counts, "access_latency_s", "access_calls") if c > 0]
    if not pairs:
        return {}
    totals = [s for s, _ in pairs]
    return {
        "access/latency_s/per_call": sum(totals) / sum(c for _, c in pairs),
        "access/latency_s/per_traj_p50": nearest_rank(totals, 50),
        "access/latency_s/per_traj_p99": nearest_rank(totals, 99),
    }
