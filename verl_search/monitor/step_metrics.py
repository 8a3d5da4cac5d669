"""The search behaviour of one training step's rollouts as flat ``search/...`` metrics, from each trajectory's
``extra_fields`` (the stats both agent loops record, plus the reward's extra keys under ``reward_extra_info``).

Invariant: pure and total: any trajectory may lack any key (a row of another loop, a padding row, a reward without
our keys) and is then left out of that metric only; an empty step gives an empty dict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from verl_search.tool.search_tool import CALL_LATENCIES, FAILED_PREFIX, ROLLOUT_WALL_S

#: searches per trajectory are also reported as the share of trajectories with 0, 1, 2 and this many or more
MANY_SEARCHES = 3


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _values(rows: list[Mapping[str, Any]], key: str) -> list[float]:
    return [v for r in rows if (v := _number(r.get(key))) is not None]


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def search_step_metrics(extra_fields: Iterable[Any]) -> dict[str, float]:
    """``search/*`` metrics of one step's trajectories (one ``extra_fields`` dict each)."""
    rows = [f for f in extra_fields if isinstance(f, Mapping)]
    rewards = [r.get("reward_extra_info") if isinstance(r.get("reward_extra_info"), Mapping) else {} for r in rows]
    out: dict[str, float] = {}
    # calls the loop recorded; for a trajectory with none recorded (SearchTool records only when it is called), the
    # search blocks the model wrote, as the reward counted them
    calls = [
        c
        for row, reward in zip(rows, rewards, strict=True)
        if (c := _number(row.get("search_calls", reward.get("num_searches")))) is not None
    ]
    if calls:
        out["search/calls_per_traj/mean"] = _mean(calls)
        out["search/calls_per_traj/max"] = max(calls)
        for n in range(MANY_SEARCHES):
            out[f"search/calls_per_traj/share_{n}"] = sum(c == n for c in calls) / len(calls)
        out[f"search/calls_per_traj/share_{MANY_SEARCHES}_or_more"] = sum(c >= MANY_SEARCHES for c in calls) / len(
            calls
        )
    for metric, source, key in (
        ("search/answered_share", rewards, "answered"),
        ("search/gold_in_results_share", rewards, "gold_in_results"),
    ):
        if values := _values(source, key):
            out[metric] = _mean([float(v > 0) for v in values])
    if invalid := _values(rows, "invalid_actions"):
        out["search/invalid_action_share"] = _mean([float(v > 0) for v in invalid])
    failures = _values(rows, "search_failures")
    if failures and calls:
        out["search/failed_share"] = sum(failures) / max(sum(calls), 1.0)
    kinds = sorted({k for r in rows for k in r if isinstance(k, str) and k.startswith(FAILED_PREFIX)})
    for key in kinds:
        out[f"search/failed/{key.removeprefix(FAILED_PREFIX)}"] = sum(_values(rows, key))
    latencies = [v for r in rows for x in (r.get(CALL_LATENCIES) or []) if (v := _number(x)) is not None]
    if latencies:
        out["search/latency_s/p50"] = _nearest_rank(latencies, 50)
        out["search/latency_s/p99"] = _nearest_rank(latencies, 99)
    timed = [r for r in rows if _number(r.get(ROLLOUT_WALL_S))]
    if timed:  # trajectories run concurrently: the share of each one's wall time it waited on search, averaged
        out["search/wait_share"] = _mean(
            [min(1.0, (_number(r.get("search_latency_s")) or 0.0) / _number(r[ROLLOUT_WALL_S])) for r in timed]
        )
    return out
