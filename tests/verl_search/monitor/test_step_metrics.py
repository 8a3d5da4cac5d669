"""Per-step search metrics from the trajectories' extra_fields: what a user reads on the step's dashboard."""

from __future__ import annotations

import pytest

from verl_search.monitor.step_metrics import search_step_metrics
from verl_search.tool.search_tool import SearchOutcome, record_search


def trajectory(latencies=(), failures=(), *, answered=1.0, gold=1.0, invalid=0, wall=None) -> dict:
    """A trajectory's extra_fields as the loops and the reward leave them (no stats when it never searched, as
    SearchTool leaves a tool_agent trajectory)."""
    reward = {"answered": answered, "gold_in_results": gold, "num_searches": float(len(latencies))}
    fields: dict = {"reward_extra_info": reward}
    for i, latency in enumerate(latencies):
        failure = failures[i] if i < len(failures) else None
        outcome = SearchOutcome(text="x", ok=failure is None, failure=failure, num_queries=1)
        outcome.latency_s = latency
        record_search(fields, outcome)
    fields["invalid_actions"] = invalid
    if wall is not None:
        fields["rollout_wall_s"] = wall
    return fields


def test_a_healthy_step():
    m = search_step_metrics([
        trajectory([0.1, 0.3], wall=2.0),
        trajectory([0.2], wall=1.0),
        trajectory([], answered=0.0, gold=0.0, invalid=2, wall=1.0),
        trajectory([0.1, 0.1, 0.1]),
    ])  # fmt: skip
    assert m["search/calls_per_traj/mean"] == pytest.approx(6 / 4)
    assert m["search/calls_per_traj/max"] == 3
    assert [m[f"search/calls_per_traj/share_{n}"] for n in range(3)] == [0.25, 0.25, 0.25]
    assert m["search/calls_per_traj/share_3_or_more"] == 0.25
    assert m["search/answered_share"] == 0.75 and m["search/gold_in_results_share"] == 0.75
    assert m["search/invalid_action_share"] == 0.25
    assert m["search/latency_s/p50"] == pytest.approx(0.1) and m["search/latency_s/p99"] == pytest.approx(0.3)
    assert m["search/wait_share"] == pytest.approx((0.4 / 2 + 0.2 / 1 + 0.0) / 3)  # the 3 timed trajectories
    assert m["search/failed_share"] == 0.0 and not any(k.startswith("search/failed/") for k in m)


def test_failures_are_counted_by_cause():
    m = search_step_metrics([
        trajectory([5.0, 5.0, 0.2], ["timeout", "timeout"]),
        trajectory([0.1], ["rate_limited"]),
    ])  # fmt: skip
    assert m["search/failed/timeout"] == 2 and m["search/failed/rate_limited"] == 1
    assert m["search/failed_share"] == pytest.approx(3 / 4)


def test_rows_without_our_keys_are_left_out_not_fatal():
    assert search_step_metrics([]) == {}
    assert search_step_metrics([None, "junk", {}, {"reward_extra_info": "junk"}]) == {}
    # a reward-only view (rows of a loop that records no calls) still counts the model's search blocks
    m = search_step_metrics([{"reward_extra_info": {"num_searches": 2.0, "answered": 1.0}}])
    assert m["search/calls_per_traj/mean"] == 2.0 and m["search/answered_share"] == 1.0
    # non-numbers and infinities are ignored
    m = search_step_metrics([{"search_calls": "x", "search_call_latencies": [float("inf"), 0.5]}])
    assert m == {"search/latency_s/p50": 0.5, "search/latency_s/p99": 0.5}
