"""A fleet of web-backend replicas sharing one cache file reports one web block: counters summed, the shared file's
figures (cached answers, the run's calls and spend) not counted once per replica, and the hit rate of the sums."""

from __future__ import annotations

import pytest

from local_dense_retriever.serve.fleet_view import fleet_metrics


def replica(lookups: int, hits: int, run_calls: int, spend: float, answers: int) -> dict:
    web = {
        "provider": "serper", "lookups_total": lookups, "cache_hits_total": hits, "cache_hit_rate": hits / lookups,
        "run_live_calls": run_calls, "run_spend_usd": spend, "cached_answers": answers, "budget_refusals_total": 1,
        "cached_pages": answers // 2, "page_fetches_total": 3, "page_fetch_failures_by_kind": {"address_refused": 1},
    }  # fmt: skip
    return {"healthy": True, "health": {"status": "ready"}, "metrics": {"requests_total": lookups, "web": web}}


def test_the_fleets_web_block_sums_counters_but_not_the_shared_ledger():
    m = fleet_metrics({"a": replica(10, 5, 7, 0.007, 40), "b": replica(30, 3, 9, 0.009, 42)}, {})
    web = m["web"]
    assert web["lookups_total"] == 40 and web["cache_hits_total"] == 8 and web["budget_refusals_total"] == 2
    assert web["cache_hit_rate"] == pytest.approx(8 / 40)
    assert (web["run_live_calls"], web["run_spend_usd"], web["cached_answers"]) == (9, 0.009, 42)
    assert web["cached_pages"] == 21 and web["page_fetches_total"] == 6
    assert web["page_fetch_failures_by_kind"] == {"address_refused": 2}
    assert web["provider"] == "serper"
