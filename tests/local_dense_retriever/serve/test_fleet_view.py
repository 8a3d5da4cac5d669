"""The fleet's /health and /metrics from its replicas' reports: the single server's bodies, for all of them."""

from __future__ import annotations

from local_dense_retriever.serve.fleet_view import fleet_health, fleet_metrics


def report(status="ready", requests=0, p99=None, batches=0, mean_batch=None, age=0.4) -> dict:
    healthy = status == "ready"
    health = {"status": status, "detail": f"{status} detail", "passages": 300, "batching": True, "pages": None}
    metrics = {
        "uptime_s": 10.0 + requests,
        "requests_total": requests,
        "responses_by_status": {"200": requests},
        "errors_by_kind": {},
        "batches_total": batches,
        "mean_batch_size": mean_batch,
        "latency_ms": {"p50": p99 and p99 / 2, "p90": p99, "p99": p99, "window": requests},
        "cpu_seconds": {"encode": 1.5, "process": 3.0},
        "memory_bytes": {"rss": 100},
    }
    return {"health": health, "healthy": healthy, "metrics": metrics, "age_s": age}


def test_health_is_ready_while_one_replica_is():
    body, status = fleet_health({"b": report("stuck"), "a": report("ready")})
    assert status == 200 and body["status"] == "ready" and body["passages"] == 300
    assert body["detail"] == "1 of 2 replicas ready; ready detail"
    assert [(r["replica"], r["status"]) for r in body["replicas"]] == [("a", "ready"), ("b", "stuck")]


def test_health_is_503_with_no_ready_replica_or_no_report():
    body, status = fleet_health({"a": report("stuck"), "b": report("loading")})
    assert status == 503 and body["status"] == "stuck" and body["detail"].startswith("0 of 2 replicas ready")
    body, status = fleet_health({})
    assert status == 503 and body["status"] == "loading" and "no retriever replica" in body["detail"]


def test_metrics_are_the_fleets_totals_and_each_replicas_own():
    m = fleet_metrics(
        {
            "a": report(requests=3, p99=40.0, batches=2, mean_batch=4.0),
            "b": report(requests=5, p99=90.0, batches=6, mean_batch=8.0),
        },
        {"g1": {"counters": {"forwarded_total": 8, "retried_total": 1}}, "g2": {"counters": {"forwarded_total": 2}}},
    )
    assert m["requests_total"] == 8 and m["responses_by_status"] == {"200": 8}
    assert m["cpu_seconds"] == {"encode": 3.0, "process": 6.0} and m["memory_bytes"] == {"rss": 200}
    assert m["mean_batch_size"] == (2 * 4.0 + 6 * 8.0) / 8  # over every replica's batches
    assert m["latency_ms"] == {"p50": 45.0, "p90": 90.0, "p99": 90.0, "window": 8}  # the slowest replica's
    assert m["uptime_s"] == 15.0  # the oldest replica's
    assert [r["replica"] for r in m["replicas"]] == ["a", "b"] and m["replicas"][1]["requests_total"] == 5
    assert m["gateway"] == {"forwarded_total": 10, "retried_total": 1}


def test_metrics_before_any_report():
    m = fleet_metrics({}, {})
    assert m == {"replicas": [], "gateway": {}}


def test_the_board_forgets_a_replica_that_stops_reporting(monkeypatch):
    from local_dense_retriever.serve import board as board_module

    now = [100.0]
    monkeypatch.setattr(board_module.time, "monotonic", lambda: now[0])
    board = board_module.FleetBoard(ttl_s=5.0)
    board.post("retriever", "a", {"healthy": True})
    board.post("gateway", "g", {"counters": {}})
    now[0] += 3.0
    board.post("retriever", "b", {"healthy": True})
    seen = board.read()
    assert sorted(seen["retriever"]) == ["a", "b"] and seen["retriever"]["a"]["age_s"] == 3.0
    now[0] += 3.0  # a and g are 6 s old: gone (a dead replica leaves the fleet's /health)
    assert board.read() == {"retriever": {"b": {"healthy": True, "age_s": 3.0}}, "gateway": {}}


async def test_posting_goes_on_after_the_board_fails():
    import asyncio

    from local_dense_retriever.serve.board import post_forever

    posted: list[dict] = []

    class Board:
        class post:  # noqa: N801 - the shape of a Serve handle: board.post.remote(...)
            calls = 0

            @classmethod
            async def remote(cls, kind, name, body):
                cls.calls += 1
                if cls.calls == 1:
                    raise ConnectionError("the board's replica is being replaced")
                posted.append(body)

    task = asyncio.create_task(post_forever(Board, "retriever", "a", lambda: {"n": 1}, period_s=0.01))
    while len(posted) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    assert posted[0] == {"n": 1}
