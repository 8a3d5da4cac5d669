"""The retriever on Ray Serve with a real local Ray cluster: replicas behind one address answering /health and /metrics
for the whole fleet, a replica killed under load behind the gateway, and the sharded mode against the single flat
index (ids, order and ties).

One Ray instance (2 logical CPUs) and one Serve proxy serve the whole module; replicas ask for 0.1 CPU each.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from cpu_bench.background_server import free_port, poll_json  # noqa: E402
from local_dense_retriever.config import ServerConfig  # noqa: E402
from local_dense_retriever.engine import load_engine  # noqa: E402
from local_dense_retriever.serve.fleet import start_fleet, stop_fleet  # noqa: E402
from local_dense_retriever.serve.options import ServeOptions  # noqa: E402

APP = "retriever"
REPLICA = f"SERVE_REPLICA::{APP}#Retriever#"  # Serve's name of a replica actor
#: the model's queries of a rollout step, roughly: names and topics of the toy world
QUERIES = ["who founded the city", "astronomer born in 1824", "the company where he worked", "ancient scripts"]


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def config(toy_dataset, minilm_index, minilm_path) -> ServerConfig:
    return ServerConfig(
        index_path=minilm_index["npy"],
        corpus_path=toy_dataset.corpus_path,
        retriever_name="minilm",
        retriever_model=str(minilm_path),
        encoder_dtype="float32",
        num_threads=1,
        port=free_port(),
    )


@pytest.fixture(scope="module")
def replicated(ray_cluster, config):
    """Two replicas of the retriever behind the Serve proxy; yields the one URL."""
    url = start_fleet(config, ServeOptions(app_name=APP, num_replicas=2, num_cpus=0.1, startup_timeout_s=240))
    yield url
    stop_fleet(ServeOptions(app_name=APP))


def running_replicas() -> int:
    app = serve.status().applications.get(APP)
    return app.deployments["Retriever"].replica_states.get("RUNNING", 0) if app else 0


def retrieve(url: str, queries: list[str], topk: int = 3) -> list:
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk, "return_scores": True}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["result"]


def fleet(url: str, path: str, until) -> dict:
    """GET ``path`` until ``until(body)`` holds (the replicas report to the gateway about once a second)."""
    return poll_json(f"{url}{path}", until)


def test_two_replicas_answer_through_one_address_as_one_service(replicated, config):
    """The default fleet (no gateway: the replicas take HTTP themselves)."""
    assert replicated == f"http://127.0.0.1:{config.port}"
    assert running_replicas() == 2
    # /health is the fleet's: the single server's body, for every replica
    # (a replica reports "loading" until its app has started: wait for both to say ready)
    health = fleet(replicated, "/health", lambda h: [r["status"] for r in h.get("replicas", [])] == ["ready"] * 2)
    assert health["status"] == "ready" and health["passages"] == 300
    assert health["detail"].startswith("2 of 2 replicas ready")
    assert [r["status"] for r in health["replicas"]] == ["ready", "ready"]
    local = load_engine(config, progress=False).search(QUERIES, 3)
    for _ in range(6):  # requests land on both replicas; every answer is the single server's
        result = retrieve(replicated, QUERIES)
        assert [[h["document"]["id"] for h in q] for q in result] == [[d["id"] for d, _ in q] for q in local]
    bad = httpx.post(f"{replicated}/retrieve", json={"queries": "not a list"}, timeout=10)
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"  # the app's own JSON errors
    # /metrics is the fleet's: the single server's keys summed over the replicas, each replica's own body listed
    metrics = fleet(replicated, "/metrics", lambda m: m.get("requests_total", 0) >= 7)
    assert metrics["requests_total"] >= 7 and metrics["responses_by_status"]["422"] >= 1
    assert len(metrics["replicas"]) == 2
    assert metrics["requests_total"] == sum(r["requests_total"] for r in metrics["replicas"])
    assert metrics["latency_ms"]["p99"] == max(r["latency_ms"]["p99"] or 0 for r in metrics["replicas"])
    assert metrics["gateway"] == {}  # no gateway in this mode


def _kill_one_replica() -> None:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(REPLICA)]
    assert len(names) == 2, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)


@pytest.fixture
def behind_gateway(ray_cluster, replicated, config):
    """The same two replicas with a gateway in front (``gateway_replicas=1``), in place of the default fleet."""
    stop_fleet(ServeOptions(app_name=APP))
    options = ServeOptions(app_name=APP, num_replicas=2, num_cpus=0.1, startup_timeout_s=240, gateway_replicas=1)
    yield start_fleet(config, options)
    stop_fleet(options)


async def test_killing_a_replica_loses_no_request_behind_the_gateway(behind_gateway):
    """Search calls through the tool while one replica is killed: every call succeeds, those caught in flight on the
    dead replica too (the gateway retries them on the live one), and Serve starts a replacement."""
    replicated = behind_gateway
    from verl_search import run_search
    from verl_search.tool.client import RetrievalClient
    from verl_search.tool.config import SearchToolConfig

    tool = SearchToolConfig(retrieval_service_url=[f"{replicated}/retrieve"], timeout=30, cache_size=0)
    calls: list[tuple[float, object]] = []
    stop = False

    async def rollout(i: int) -> None:
        n = i
        while not stop:
            started = time.monotonic()
            outcome = await run_search(tool, [f"{QUERIES[n % len(QUERIES)]} {n}"])
            calls.append((started, outcome))
            n += 32

    tasks = [asyncio.create_task(rollout(i)) for i in range(32)]
    await asyncio.sleep(2)
    await asyncio.to_thread(_kill_one_replica)
    killed_at = time.monotonic()
    await asyncio.sleep(4)
    stop = True
    await asyncio.gather(*tasks)
    await RetrievalClient.close_all()

    after = [o for t, o in calls if t > killed_at]
    assert len(after) >= 8, "too few calls after the kill to say anything"
    assert [o.text for _, o in calls if not o.ok] == []  # zero failed calls, before, during and after the kill
    deadline = time.monotonic() + 90
    while running_replicas() < 2 and time.monotonic() < deadline:  # Serve replaces the dead replica
        await asyncio.sleep(1)
    assert running_replicas() == 2
    assert len(retrieve(replicated, QUERIES)) == len(QUERIES)
    gateway = fleet(replicated, "/metrics", lambda m: len(m["replicas"]) == 2)["gateway"]
    assert gateway["failed_after_retry_total"] == 0
    print(f"calls: {len(calls)}; retried by the gateway after the kill: {gateway['retried_total']}")


@pytest.fixture(scope="module")
def tied_config(config, minilm_index, tmp_path_factory) -> ServerConfig:
    """The toy index with duplicate passages across the shard boundary (rows 150 and 10, 151 and 149 equal), so ties
    meet the cut and the merge."""
    vectors = np.load(minilm_index["npy"])
    vectors[150], vectors[151] = vectors[10], vectors[149]
    path = tmp_path_factory.mktemp("tied") / "tied.npy"
    np.save(path, vectors)
    return config.model_copy(update={"index_path": path})


def test_sharded_mode_returns_the_single_index_top_k(ray_cluster, replicated, tied_config, toy_dataset):
    stop_fleet(ServeOptions(app_name=APP))  # the proxy's "/" is the sharded app's from here on
    options = ServeOptions(app_name="sharded", shards=2, num_cpus=0.1, startup_timeout_s=240)
    url = start_fleet(tied_config, options)
    try:
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert "2 shards" in health["detail"] and health["passages"] == 300
        corpus = [line for line in toy_dataset.corpus_path.read_text().splitlines()]
        import json

        texts = [json.loads(corpus[i])["contents"] for i in (10, 149, 5, 200, 299)]
        queries = QUERIES + texts
        single = load_engine(tied_config, progress=False).search(queries, 10)
        sharded = retrieve(url, queries, topk=10)
        assert [[h["document"]["id"] for h in q] for q in sharded] == [[d["id"] for d, _ in q] for q in single]
        np.testing.assert_allclose(
            [[h["score"] for h in q] for q in sharded], [[s for _, s in q] for q in single], rtol=1e-6, atol=1e-6
        )
        tied = [[h["document"]["id"] for h in q][:2] for q in sharded[len(QUERIES) : len(QUERIES) + 2]]
        assert tied == [["10", "150"], ["149", "151"]]  # the tie went to the lower id, across the shard boundary
    finally:
        stop_fleet(options)
