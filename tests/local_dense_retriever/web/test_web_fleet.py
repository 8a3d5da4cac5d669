"""The web backend inside a real Ray Serve fleet: two replicas behind one address, against the stub provider on
127.0.0.1, sharing one cache file and one run budget; the fleet's /metrics adds up the replicas' web figures and the
API key shows up in none of its logs, /metrics or /health.

The key is set in this process only after Ray started, so the replicas (Ray's worker processes) can only have it from
the launcher, as replicas on other nodes would.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from cpu_bench.background_server import free_port, poll_json  # noqa: E402
from local_dense_retriever.config import ServerConfig  # noqa: E402
from local_dense_retriever.serve.errors import ServeSetupError  # noqa: E402
from local_dense_retriever.serve.fleet import start_fleet, stop_fleet  # noqa: E402
from local_dense_retriever.serve.options import ServeOptions  # noqa: E402

APP = "web-fleet"
#: live calls the run may make, for the whole fleet
MAX_LIVE_CALLS = 3


@pytest.fixture(scope="module")
def ray_logs():
    """A local Ray instance (2 logical CPUs) for the module; yields its log folder."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield Path(ray._private.worker._global_node.get_logs_dir_path())
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def stub(provider_server):
    provider_server.reset("serper")
    return provider_server


@pytest.fixture(scope="module")
def web_fleet(ray_logs, stub, secret, tmp_path_factory):
    """Two web replicas behind one address, one cache file; yields (url, the stub)."""
    folder = tmp_path_factory.mktemp("web_fleet")
    config = ServerConfig(
        backend="web",
        web_provider="serper",
        web_base_url=f"{stub.url}/search",
        web_cache_path=folder / "web.sqlite3",
        web_timeout_s=10.0,
        web_qps=1000.0,
        web_max_live_calls=MAX_LIVE_CALLS,
        cache_dir=folder,
        port=free_port(),
    )
    os.environ["SERPER_API_KEY"] = secret  # after ray.init: only the launcher's process has it
    try:
        url = start_fleet(config, ServeOptions(app_name=APP, num_replicas=2, num_cpus=0.1, startup_timeout_s=240))
        yield url, stub
        stop_fleet(ServeOptions(app_name=APP))
    finally:
        del os.environ["SERPER_API_KEY"]


def retrieve(url: str, query: str) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": 2, "return_scores": True}, timeout=60)


def fleet_metrics(url: str, until, timeout: float = 20.0) -> dict:
    """GET /metrics until ``until(body)`` holds (each replica reports to the fleet about once a second)."""
    return poll_json(f"{url}/metrics", until, timeout=timeout)


def web_lookups(metrics: dict) -> int | None:
    return (metrics.get("web") or {}).get("lookups_total")


def both_replicas(metrics: dict, key: str) -> bool:
    webs = [r.get("web", {}) for r in metrics.get("replicas", [])]
    return len(webs) == 2 and all((w.get(key) or 0) >= 1 for w in webs)


def test_a_web_fleet_shares_its_cache_and_budget_and_adds_up_its_figures(web_fleet):
    url, stub = web_fleet
    sent = 1
    first = retrieve(url, "Ada Lovelace")
    assert first.status_code == 200, first.text
    [hits] = first.json()["result"]
    assert [h["document"]["contents"] for h in hits] == [
        '"ada lovelace page 0"\nAbout ada lovelace, 0.',  # the provider's answer, in the /retrieve wire format
        '"ada lovelace page 1"\nAbout ada lovelace, 1.',
    ]
    assert [h["document"]["url"] for h in hits] == [f"https://example.org/ada-lovelace/{i}" for i in range(2)]
    assert [h["score"] for h in hits] == [1.0, 0.5] and hits[0]["document"]["id"].startswith("web-")

    # the same query again until both replicas have answered it: one provider call for the whole fleet
    for _ in range(40):
        sent += 1
        assert retrieve(url, "Ada Lovelace").json()["result"] == [hits]
        if both_replicas(fleet_metrics(url, lambda m: True, timeout=0), "lookups_total"):
            break
    metrics = fleet_metrics(url, lambda m: both_replicas(m, "lookups_total"))
    assert len(stub.requests) == 1
    webs = [r["web"] for r in metrics["replicas"]]
    assert sorted(w["live_requests_total"] for w in webs) == [0, 1]
    the_other = next(w for w in webs if w["live_requests_total"] == 0)
    assert the_other["cache_hits_total"] == the_other["lookups_total"] >= 1  # the first replica's answer, cached

    # distinct queries: the run's ceiling holds for the fleet, whichever replica takes the query past it
    statuses = []
    for i in range(40):
        r = retrieve(url, f"query {i}")
        statuses.append((r.status_code, r.json().get("error")))
        if len(statuses) >= MAX_LIVE_CALLS and both_replicas(
            fleet_metrics(url, lambda m: True, 0), "budget_refusals_total"
        ):
            break
    assert statuses[: MAX_LIVE_CALLS - 1] == [(200, None)] * (MAX_LIVE_CALLS - 1)
    refused = statuses[MAX_LIVE_CALLS - 1 :]
    assert refused and set(refused) == {(503, "budget_exhausted")}
    assert len(stub.requests) == MAX_LIVE_CALLS
    assert retrieve(url, "ada lovelace").status_code == 200  # a cached query is still answered
    sent += len(statuses) + 1

    metrics = fleet_metrics(url, lambda m: web_lookups(m) == sent)  # every report in
    assert both_replicas(metrics, "budget_refusals_total")  # each replica refused a query past the ceiling
    assert web_lookups(metrics) == sent
    web, replicas = metrics["web"], [r["web"] for r in metrics["replicas"]]
    assert web["live_requests_total"] == len(stub.requests) == MAX_LIVE_CALLS
    assert web["run_live_calls"] == MAX_LIVE_CALLS and web["cached_answers"] == MAX_LIVE_CALLS
    assert web["budget_refusals_total"] == len(refused) == metrics["errors_by_kind"]["budget_exhausted"]
    for key in ("lookups_total", "cache_hits_total", "budget_refusals_total", "live_requests_total"):
        assert web[key] == sum(w[key] for w in replicas), key
    assert web["cache_hit_rate"] == pytest.approx(web["cache_hits_total"] / web["lookups_total"])


def test_the_key_is_in_none_of_the_fleets_logs_metrics_or_health(web_fleet, ray_logs, secret):
    url, stub = web_fleet
    assert retrieve(url, "grace hopper").status_code in (200, 503)
    assert stub.requests and all(r["headers"]["x-api-key"] == secret for r in stub.requests)  # the key was used
    for path in ("/metrics", "/health"):
        body = httpx.get(f"{url}{path}", timeout=10).text
        assert "web search (serper" in body or path == "/metrics"
        assert secret not in body, path
    logs = [p for p in ray_logs.rglob("*") if p.is_file()]
    assert any("serve" in p.parts for p in logs)  # the replicas' own logs are there
    leaked = [p.name for p in logs if secret.encode() in p.read_bytes()]
    assert leaked == []


def test_a_web_fleet_without_its_key_fails_before_anything_is_deployed(monkeypatch, tmp_path):
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    config = ServerConfig(backend="web", web_provider="serpapi", cache_dir=tmp_path, port=free_port())
    with pytest.raises(ServeSetupError, match="environment variable SERPAPI_API_KEY holding the API key is not set"):
        start_fleet(config, ServeOptions(app_name="never"))
