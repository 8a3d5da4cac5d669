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


def test_searches_answered_from_the_cache_or_a_twin_call_are_a_share_of_the_queries():
    def searched(*calls: tuple[int, int, int]) -> dict:  # (queries, of them reused, of those joined) per call
        fields: dict = {}
        for queries, reused, joined in calls:
            record_search(fields, SearchOutcome(text="x", ok=True, num_queries=queries, cached=reused, joined=joined))
        return fields

    m = search_step_metrics([searched((1, 0, 0), (2, 1, 1)), searched((1, 1, 0)), searched(), {"search_calls": 0}])
    assert m["search/reused_share"] == pytest.approx(2 / 4) and m["search/joined_share"] == pytest.approx(1 / 4)
    m = search_step_metrics([searched((1, 0, 0))])
    assert m["search/reused_share"] == m["search/joined_share"] == 0.0
    # rows recorded before the counts existed are left out of them
    assert "search/reused_share" not in search_step_metrics([{"search_calls": 2, "search_cached": 1}])


def test_rows_without_our_keys_are_left_out_not_fatal():
    assert search_step_metrics([]) == {}
    assert search_step_metrics([None, "junk", {}, {"reward_extra_info": "junk"}]) == {}
    # a reward-only view (rows of a loop that records no calls) still counts the model's search blocks
    m = search_step_metrics([{"reward_extra_info": {"num_searches": 2.0, "answered": 1.0}}])
    assert m["search/calls_per_traj/mean"] == 2.0 and m["search/answered_share"] == 1.0
    # non-numbers and infinities are ignored
    m = search_step_metrics([{"search_calls": "x", "search_call_latencies": [float("inf"), 0.5]}])
    assert m == {"search/latency_s/p50": 0.5, "search/latency_s/p99": 0.5}


def tool_agent_trajectory(places, chars, calls=None) -> dict:
    """extra_fields as SearchTool leaves a ``tool_agent`` trajectory: where each result was to go and its length."""
    return {"search_calls": calls if calls is not None else len(places), "search_result_at": places,
            "search_result_chars": chars}  # fmt: skip


def test_results_cut_dropped_or_shortened_are_counted():
    m = search_step_metrics(
        [
            tool_agent_trajectory([10, 60], [300, 300]),  # both fit: the response went on after each
            tool_agent_trajectory([10, 90], [300, 300]),  # the second was dropped: the response ends where it was to go
            tool_agent_trajectory([10], [2000]),  # longer than verl's character limit: cut
            {"search_calls": 3, "search_results_cut": 1, "search_result_tokens_cut": 57},  # the native loop's own count
        ],
        response_lens=[120, 90, 200, 512],
        max_result_chars=1000,
    )
    assert m["search/results_dropped"] == 1
    assert m["search/results_cut_share"] == pytest.approx((1 + 1 + 1) / (2 + 2 + 1 + 3))
    assert m["search/result_tokens_cut"] == 57


def test_results_cut_needs_the_response_lengths_and_is_zero_when_all_fit():
    rows = [tool_agent_trajectory([10], [300])]
    assert "search/results_cut_share" not in search_step_metrics(rows)  # no lengths: nothing can be said
    m = search_step_metrics(rows, response_lens=[50], max_result_chars=None)
    assert m["search/results_cut_share"] == 0 and m["search/results_dropped"] == 0


def test_wait_share_of_a_tool_agent_trajectory_comes_from_its_loop_timings():
    rows = [tool_agent_trajectory([10], [300]), {"search_calls": 0}, trajectory([0.5], wall=1.0)]
    timings = [{"generate_sequences": 3.0, "tool_calls": 1.0}, {"generate_sequences": 2.0}, {}]
    m = search_step_metrics(rows, timings=timings, response_lens=[50, 20, 80])
    assert m["search/wait_share"] == pytest.approx((0.25 + 0.0 + 0.5) / 3)


def test_misaligned_inputs_are_an_error_not_a_silent_shift():
    with pytest.raises(ValueError):
        search_step_metrics([{}, {}], response_lens=[1])


def test_results_trained_on_as_if_the_model_wrote_them_are_a_share_of_the_trajectories_shown_results():
    rows = [
        tool_agent_trajectory([10], [300]),  # shown a result, its tokens masked: fine
        tool_agent_trajectory([10], [300]),  # shown a result, nothing masked: the loop's mask is broken
        tool_agent_trajectory([90], [300]),  # its only result was dropped unseen at the response's end: not counted
        {"search_calls": 0},  # searched nothing: not counted
    ]
    m = search_step_metrics(rows, response_lens=[50, 50, 90, 30], masked_tokens=[80, 0, 0, 0])
    assert m["search/unmasked_results_share"] == 0.5
    assert "search/unmasked_results_share" not in search_step_metrics(rows, response_lens=[50, 50, 90, 30])


def test_masked_tokens_are_counted_within_each_response_from_nested_or_padded_masks():
    import torch

    from verl_search.monitor.trainer import masked_token_counts

    rows = [torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 1, 1])]
    assert masked_token_counts(torch.nested.nested_tensor(rows, layout=torch.jagged), [5, 3]) == [2, 0]
    padded = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]])  # padding past a response's length is not masking
    assert masked_token_counts(padded, [5, 3]) == [2, 0]
    assert masked_token_counts(padded, [None, 3]) == [None, 0]
