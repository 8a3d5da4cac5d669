"""The search behaviour of one training step's rollouts as flat ``search/...`` metrics (with their page access as
``access/...`` ones, :mod:`~verl_search.monitor.access_metrics`), from each trajectory's ``extra_fields`` (the loops'
stats and the reward's keys) and, where the trainer has them, its length and timings.

Invariant: pure and total: any trajectory may lack any key (a row of another loop, a padding row, a reward without
our keys) and is then left out of that metric only; an empty step gives an empty dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from verl_search.monitor.access_metrics import access_step_metrics
from verl_search.monitor.values import as_list, mean, nearest_rank, number, numbers
from verl_search.tool.search_tool import (
    CALL_LATENCIES,
    FAILED_PREFIX,
    RESULT_AT,
    RESULT_CHARS,
    RESULT_TOKENS_CUT,
    RESULTS_CUT,
    ROLLOUT_WALL_S,
    SEARCH_JOINED,
    SEARCH_QUERIES,
)

#: a trajectory as the metrics read it: its fields, response length, loop timings and masked response tokens
Trajectory = tuple[Mapping[str, Any], Any, Any, Any]
#: searches per trajectory are also reported as the share of trajectories with 0, 1, 2 and this many or more
MANY_SEARCHES = 3


def search_step_metrics(
    extra_fields: Iterable[Any],
    *,
    response_lens: Iterable[Any] | None = None,
    timings: Iterable[Any] | None = None,
    max_result_chars: int | None = None,
    masked_tokens: Iterable[Any] | None = None,
) -> dict[str, float]:
    """``search/*`` and ``access/*`` metrics of one step's trajectories (one ``extra_fields`` dict each); the optional
    columns, aligned with it, are each one's response tokens, loop timings and loss-masked tokens, and verl's
    ``max_tool_response_length``: without them the metrics that need them are left out."""
    given = list(extra_fields)
    columns = [[None] * len(given) if c is None else list(c) for c in (response_lens, timings, masked_tokens)]
    kept: list[Trajectory] = [t for t in zip(given, *columns, strict=True) if isinstance(t[0], Mapping)]
    rows = [t[0] for t in kept]
    rewards = [r.get("reward_extra_info") if isinstance(r.get("reward_extra_info"), Mapping) else {} for r in rows]
    out: dict[str, float] = {}
    # calls the loop recorded, else (SearchTool records only when called) the search blocks the reward counted
    calls = [
        c
        for row, reward in zip(rows, rewards, strict=True)
        if (c := number(row.get("search_calls", reward.get("num_searches")))) is not None
    ]
    if calls:
        out["search/calls_per_traj/mean"] = mean(calls)
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
        if values := numbers(source, key):
            out[metric] = mean([float(v > 0) for v in values])
    if invalid := numbers(rows, "invalid_actions"):
        out["search/invalid_action_share"] = mean([float(v > 0) for v in invalid])
    failures = numbers(rows, "search_failures")
    if failures and calls:
        out["search/failed_share"] = sum(failures) / max(sum(calls), 1.0)
    kinds = sorted({k for r in rows for k in r if isinstance(k, str) and k.startswith(FAILED_PREFIX)})
    for key in kinds:
        out[f"search/failed/{key.removeprefix(FAILED_PREFIX)}"] = sum(numbers(rows, key))
    out.update(_reused(rows))
    latencies = [v for r in rows for x in as_list(r.get(CALL_LATENCIES)) if (v := number(x)) is not None]
    if latencies:
        out["search/latency_s/p50"] = nearest_rank(latencies, 50)
        out["search/latency_s/p99"] = nearest_rank(latencies, 99)
    out.update(_results_cut(kept, max_result_chars))
    out.update(_unmasked_results(kept))
    if shares := [s for f, _, t, _ in kept if (s := _wait_share(f, t)) is not None]:
        out["search/wait_share"] = mean(shares)  # trajectories run concurrently: each one's own share, averaged
    out.update(access_step_metrics(rows, rewards))
    return out


def _reused(rows: list[Mapping[str, Any]]) -> dict[str, float]:
    """Shares of the step's queries answered from the cache, or by joining an identical call in flight."""
    counts = [
        (queries, cached, joined)
        for r in rows
        if (queries := number(r.get(SEARCH_QUERIES)))
        and (cached := number(r.get("search_cached"))) is not None
        and (joined := number(r.get(SEARCH_JOINED))) is not None
    ]
    if not counts:
        return {}
    queries = sum(q for q, _, _ in counts)
    return {
        "search/reused_share": sum(c for _, c, _ in counts) / queries,
        "search/joined_share": sum(j for _, _, j in counts) / queries,
    }


def _results_cut(kept: list[Trajectory], max_result_chars: int | None) -> dict[str, float]:
    """Search results that reached the model incomplete: cut to ``max_result_chars`` or dropped whole (placed at or past
    the response's end) by verl's ``tool_agent``, or cut at the response length by ``search_r1_agent``."""
    results = cut = dropped = 0
    tokens_cut = 0.0
    seen = False
    for fields, response_len, _, _ in kept:
        places, sizes = as_list(fields.get(RESULT_AT)), as_list(fields.get(RESULT_CHARS))
        length = number(response_len)
        if places and length is not None:
            seen = True
            for i, place in enumerate(places):
                at = number(place)
                chars = number(sizes[i]) if i < len(sizes) else None
                lost = at is not None and at >= length
                shortened = max_result_chars is not None and chars is not None and chars > max_result_chars
                results += 1
                dropped += int(lost)
                cut += int(lost or shortened)
        elif (native_cut := number(fields.get(RESULTS_CUT))) is not None:
            seen = True
            results += int(number(fields.get("search_calls")) or 0)
            cut += int(native_cut)
            tokens_cut += number(fields.get(RESULT_TOKENS_CUT)) or 0.0
    if not seen:
        return {}
    return {
        "search/results_cut_share": cut / max(results, 1),
        "search/results_dropped": float(dropped),
        "search/result_tokens_cut": tokens_cut,
    }


def _unmasked_results(kept: list[Trajectory]) -> dict[str, float]:
    """The share of trajectories shown search results with no loss-masked response token: results trained on as if
    the model had written them (0 unless a loop's mask is broken)."""
    shown = unmasked = 0
    for fields, response_len, _, masked_count in kept:
        count, length = number(masked_count), number(response_len)
        if count is None or not (number(fields.get("search_calls")) or 0) > 0:
            continue
        places = [number(p) for p in as_list(fields.get(RESULT_AT))]
        if places and length is not None and all(p is not None and p >= length for p in places):
            continue
        shown += 1
        unmasked += int(count == 0)
    return {"search/unmasked_results_share": unmasked / shown} if shown else {}


def _wait_share(fields: Mapping[str, Any], timing: Any) -> float | None:
    """The share of a trajectory's time spent waiting on search: of its wall time where the loop measured it, else of
    its generation plus tool time."""
    wall = number(fields.get(ROLLOUT_WALL_S))
    if wall:
        return min(1.0, (number(fields.get("search_latency_s")) or 0.0) / wall)
    if not isinstance(timing, Mapping) or not (generation := number(timing.get("generate_sequences"))):
        return None
    tools = number(timing.get("tool_calls")) or 0.0  # absent when the trajectory called no tool
    return tools / (tools + generation)
