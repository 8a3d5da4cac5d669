"""Per-step page-access metrics from the trajectories' extra_fields, as AccessTool's record_access leaves them."""

from __future__ import annotations

import pytest

from verl_search.monitor.step_metrics import search_step_metrics
from verl_search.tool.access_record import record_access
from verl_search.tool.access_tool import AccessOutcome


def opened(*calls: tuple[str, int] | str, searches: int = 1) -> dict:
    """A trajectory's extra_fields after these access calls: ``(url, window)`` read, or a failure's kind; it searched
    ``searches`` times (the reward's count, as a tool_agent row that SearchTool never recorded)."""
    fields: dict = {"reward_extra_info": {"num_searches": float(searches)}}
    for call in calls:
        if isinstance(call, str):
            record_access(fields, AccessOutcome(text="x", ok=False, failure=call, latency_s=0.5), "https://x.org/")
        else:
            url, window = call
            record_access(fields, AccessOutcome(text="x", ok=True, page=window, latency_s=0.25), url)
    return fields


A, B = "https://a.org/page", "https://b.org/page"


def test_a_step_with_access():
    m = search_step_metrics([
        opened((A, 1), (A, 2), (B, 1)),
        opened((A, 1), "timeout"),
        opened((A, 1), (A, 1), (A, 1)),  # the same window three times: two repeats
        opened(),  # searched and answered without opening a page
        opened("not_found", "timeout"),
    ])  # fmt: skip
    assert m["access/pages_per_traj/mean"] == pytest.approx((2 + 1 + 1 + 0 + 0) / 5)
    assert m["access/pages_per_traj/max"] == 2 and m["access/pages_per_traj/share_0"] == pytest.approx(2 / 5)
    assert m["access/windows_per_traj/mean"] == pytest.approx((3 + 1 + 3) / 5) and m["access/windows_per_traj/max"] == 3
    assert m["access/windows_read"] == 7 and m["access/calls_per_traj/mean"] == pytest.approx(10 / 5)
    assert m["access/repeat_share"] == pytest.approx(2 / 7) and m["access/repeats_per_traj/max"] == 2
    assert m["access/failed_share"] == pytest.approx(3 / 10)
    assert m["access/failed/timeout"] == 2 and m["access/failed/not_found"] == 1
    assert m["access/latency_s/per_call"] == pytest.approx((7 * 0.25 + 3 * 0.5) / 10)
    # each calling trajectory's total wait: 0.75, 0.75, 0.75, 1.0 (the one that never called is not a latency)
    assert m["access/latency_s/per_traj_p50"] == pytest.approx(0.75) and m["access/latency_s/per_traj_p99"] == 1.0
    assert m["search/calls_per_traj/mean"] == 1.0  # the search metrics are still there


def test_a_run_without_access_gives_no_access_metric():
    m = search_step_metrics([{"search_calls": 2, "reward_extra_info": {"num_searches": 2.0}}, opened()])
    assert m and not any(k.startswith("access/") for k in m)
    assert search_step_metrics([]) == {}


def test_rows_not_of_our_loops_are_left_out_not_fatal():
    rows = [opened((A, 1)), None, "junk", {}, {"reward_extra_info": "junk"}]
    m = search_step_metrics(rows)
    assert m["access/pages_per_traj/mean"] == 1.0 and m["access/pages_per_traj/share_0"] == 0.0
    # a row whose counters are not numbers is left out of those metrics only
    m = search_step_metrics([{"access_calls": 1, "access_pages_opened": "x", "access_windows_read": 1}, opened((A, 1))])
    assert m["access/pages_per_traj/mean"] == 1.0 and m["access/windows_per_traj/mean"] == 1.0
    assert m["access/calls_per_traj/mean"] == 1.0


def test_only_failures_read_no_window():
    m = search_step_metrics([opened("invalid_arguments"), opened("not_found")])
    assert m["access/pages_per_traj/mean"] == 0.0 and m["access/windows_read"] == 0
    assert m["access/repeat_share"] == 0.0 and m["access/failed_share"] == 1.0
