"""The HTTP service on a real uvicorn server: the /retrieve contract, health, metrics, limits and error answers."""

from __future__ import annotations

import asyncio
import platform
import threading
import time

import httpx
import pytest
import torch

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.service_state import ServiceState
from verl_search.protocol import RetrieveResponse


@pytest.fixture(scope="module")
def engine(animal_corpus, make_hash_engine) -> RetrievalEngine:
    return make_hash_engine(animal_corpus)


@pytest.fixture(scope="module")
def server(engine):
    config = ServerConfig(max_queries_per_request=8, max_query_chars=200, max_topk=20, max_body_bytes=4096)
    with BackgroundServer(create_app(config, engine=engine)) as srv:
        yield srv


def post(server, body=None, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/retrieve", json=body, timeout=30, **kw)


def test_retrieve_plain_documents(server):
    r = post(server, {"queries": ["item17", "item3 dingo"], "topk": 2, "return_scores": False})
    assert r.status_code == 200
    result = r.json()["result"]
    assert [len(hits) for hits in result] == [2, 2]
    assert result[0][0] == {
        "id": "17",
        "contents": '"Doc 17"\nThe heron number item17 lives here.',
        "url": "https://en.wikipedia.org/wiki/Doc_17",  # derived from the title (pages)
    }
    assert result[1][0]["id"] == "3"
    RetrieveResponse.model_validate(r.json())


def test_retrieve_with_scores_and_default_topk(server):
    r = post(server, {"queries": ["item42"], "return_scores": True})
    result = r.json()["result"]
    assert len(result[0]) == 3  # server default topk
    assert result[0][0]["document"]["id"] == "42"
    scores = [hit["score"] for hit in result[0]]
    assert scores == sorted(scores, reverse=True)
    RetrieveResponse.model_validate(r.json())


def test_topk_null_and_return_scores_omitted(server):
    r = post(server, {"queries": ["camel"], "topk": None})
    assert r.status_code == 200 and set(r.json()["result"][0][0]) == {"id", "contents", "url"}


def test_a_repeated_query_is_answered_for_every_copy_and_counted(server):
    before = httpx.get(f"{server.url}/metrics").json()["duplicate_queries_total"]
    r = post(server, {"queries": ["item9", "item4", "item9"], "topk": 2, "return_scores": True})
    result = r.json()["result"]
    assert r.status_code == 200 and result[0] == result[2] and result[0][0]["document"]["id"] == "9"
    assert result[1][0]["document"]["id"] == "4"
    assert httpx.get(f"{server.url}/metrics").json()["duplicate_queries_total"] == before + 1


def test_health_metrics_and_docs(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ready" and health["passages"] == 50
    post(server, {"queries": ["emu"]})
    metrics = httpx.get(f"{server.url}/metrics").json()
    assert metrics["requests_total"] >= 1 and metrics["responses_by_status"]["200"] >= 1
    assert metrics["latency_ms"]["p50"] is not None and "batch_size_histogram" in metrics
    # where the CPU went: the engine's stages (encode, search, lookup) apart from the rest of the process
    cpu = metrics["cpu_seconds"]
    assert cpu["process"] > 0 and all(cpu[stage] >= 0 for stage in ("encode", "search", "lookup", "native_threads"))
    assert cpu["wall"]["encode"] > 0 and cpu["wall"]["search"] > 0
    assert cpu["encode"] + cpu["search"] + cpu["lookup"] <= cpu["process"]
    assert metrics["prefilter_crowded_queries_total"] == 0  # a 50-row index is scanned in float32 alone
    libc, version = platform.libc_ver()
    if libc == "glibc" and tuple(map(int, version.split("."))) >= (2, 33):  # the C heap: a leak (in_use) or not
        memory = metrics["memory_bytes"]
        assert memory["in_use"] > 0 and memory["rss"] > memory["in_use"] / 2
    assert "/retrieve" in httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert httpx.get(f"{server.url}/docs").status_code == 200


MALFORMED = [
    ("not json", dict(content=b"{not json", headers={"content-type": "application/json"}), 400, "invalid_json"),
    ("json array", dict(json=["q"]), 422, "invalid_request"),
    ("no queries key", dict(json={"topk": 3}), 422, "invalid_request"),
    ("queries is a string", dict(json={"queries": "who"}), 422, "invalid_request"),
    ("non-string query", dict(json={"queries": ["ok", 5]}), 422, "invalid_request"),
    ("null query", dict(json={"queries": [None]}), 422, "invalid_request"),
    ("too many queries", dict(json={"queries": ["q"] * 9}), 422, "invalid_request"),
    ("query too long", dict(json={"queries": ["x" * 201]}), 422, "invalid_request"),
    ("topk huge", dict(json={"queries": ["q"], "topk": 1_000_000_000}), 422, "invalid_request"),
    ("topk zero", dict(json={"queries": ["q"], "topk": 0}), 422, "invalid_request"),
    ("topk negative", dict(json={"queries": ["q"], "topk": -3}), 422, "invalid_request"),
    ("topk not a number", dict(json={"queries": ["q"], "topk": "many"}), 422, "invalid_request"),
    ("topk fractional", dict(json={"queries": ["q"], "topk": 2.5}), 422, "invalid_request"),
    ("topk boolean", dict(json={"queries": ["q"], "topk": True}), 422, "invalid_request"),
    ("topk numeric string", dict(json={"queries": ["q"], "topk": "3"}), 422, "invalid_request"),
    ("query and queries", dict(json={"queries": ["q"], "query": "q"}), 422, "invalid_request"),
    ("query not a string", dict(json={"query": ["q"]}), 422, "invalid_request"),
    ("unknown key", dict(json={"queries": ["q"], "tpok": 3}), 422, "invalid_request"),
    ("return_scores not bool", dict(json={"queries": ["q"], "return_scores": "maybe"}), 422, "invalid_request"),
    ("body too large", dict(json={"queries": ["q" * 5000]}), 413, "body_too_large"),
    ("empty body", dict(content=b"", headers={"content-type": "application/json"}), 422, "invalid_request"),
]


@pytest.mark.parametrize(("case", "kwargs", "status", "error"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_a_json_4xx_and_the_server_stays_up(server, case, kwargs, status, error):
    r = httpx.post(f"{server.url}/retrieve", timeout=30, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == error and body["detail"]
    assert post(server, {"queries": ["item5"], "topk": 1}).json()["result"][0][0]["id"] == "5"


def test_empty_query_list_answers_an_empty_result(server):
    """Search-R1's trainer sends {"queries": []} when no trajectory searched in a turn; its server answers 200."""
    r = post(server, {"queries": [], "topk": 3, "return_scores": True})
    assert r.status_code == 200 and r.json() == {"result": []}


def test_skyrl_single_query_body_gets_one_list_of_hits(server):
    r = post(server, {"query": "item17", "topk": 2, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 1 and len(result[0]) == 2 and result[0][0]["document"]["id"] == "17"
    r = post(server, {"query": "item3", "topk": 1, "return_scores": False})
    doc = {
        "id": "3",
        "contents": '"Doc 3"\nThe dingo number item3 lives here.',
        "url": "https://en.wikipedia.org/wiki/Doc_3",
    }
    assert r.json()["result"] == [[doc]]


def test_lone_surrogate_is_a_4xx_naming_the_problem_and_batch_mates_are_answered(server):
    bad = b'{"queries": ["fine", "broken \\ud800 text"], "topk": 1}'
    results: dict[int, httpx.Response] = {}

    def client(i: int) -> None:
        if i == 0:
            results[i] = httpx.post(f"{server.url}/retrieve", content=bad, headers={"content-type": "application/json"})
        else:
            results[i] = post(server, {"queries": [f"item{i}"], "topk": 1})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0].status_code == 422 and "surrogate" in results[0].json()["detail"]
    assert all(results[i].json()["result"][0][0]["id"] == str(i) for i in range(1, 12))


def test_health_of_a_cpu_server_lists_no_gpus(server):
    """Once loaded, /health says which GPUs it holds memory on: none here, and the rest of the body as before."""
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200
    body = r.json()
    assert body == {"status": "ready", "detail": body["detail"], "passages": 50, "batching": True, "pages": None,
                    "gpus": [], "index": body["index"]}  # fmt: skip
    assert body["index"]["type"] == "flat" and body["index"]["recall"] == {"3": 1.0}


def test_health_names_no_folders(server, animal_corpus):
    body = httpx.get(f"{server.url}/health").text
    assert str(animal_corpus.parent) not in body and animal_corpus.name in body


def test_unknown_route_and_wrong_method_are_json(server):
    r = httpx.get(f"{server.url}/nope")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.get(f"{server.url}/retrieve")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


def test_concurrent_clients_each_get_their_own_results(server):
    results: dict[int, str] = {}

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as c:
            results[i] = c.post(f"{server.url}/retrieve", json={"queries": [f"item{i}"], "topk": 1}).json()["result"][
                0
            ][0]["id"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: str(i) for i in range(40)}


def test_overload_answers_429_and_engine_failure_500_then_recovers(engine, steerable_backend):
    backend = steerable_backend(engine.backend, wait_s=20)
    steerable = RetrievalEngine(backend, engine.corpus)
    config = ServerConfig(max_queue=2, max_wait_ms=0, max_batch_size=1, max_queries_per_request=1)
    with BackgroundServer(create_app(config, engine=steerable)) as srv:
        blocked = []
        for i in range(3):  # the first is taken by the worker, the next two fill the queue
            t = threading.Thread(target=lambda i=i: blocked.append(post(srv, {"queries": [f"item{i}"]})))
            t.start()
            blocked.append(t)
        deadline = time.monotonic() + 60  # a loaded machine may start the three client threads slowly
        while httpx.get(f"{srv.url}/metrics").json()["queue_depth"] < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert httpx.get(f"{srv.url}/metrics").json()["queue_depth"] == 2, "the queue never filled"
        r = post(srv, {"queries": ["one more"]})
        assert r.status_code == 429 and r.json()["error"] == "overloaded"
        assert r.headers["retry-after"]
        backend.error = RuntimeError("index shard lost")
        backend.release.set()
        for t in [b for b in blocked if isinstance(b, threading.Thread)]:
            t.join(30)
        answers = [b for b in blocked if isinstance(b, httpx.Response)]
        assert [a.status_code for a in answers] == [500, 500, 500]
        for a in answers:  # the cause stays in the log: a 500 body names an error id, never the raw error text
            assert a.json()["error"] == "internal_error" and "error id" in a.json()["detail"]
            assert "index shard lost" not in a.text
        backend.error = None
        assert post(srv, {"queries": ["item9"], "topk": 1}).json()["result"][0][0]["id"] == "9"


def test_health_is_503_while_loading_and_after_a_failed_load(engine):
    loaded = threading.Event()

    def slow_loader() -> RetrievalEngine:
        loaded.wait(20)
        return engine

    with BackgroundServer(create_app(ServerConfig(), loader=slow_loader)) as srv:
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = post(srv, {"queries": ["x"]})
        assert r.status_code == 503 and r.json()["error"] == "not_ready"
        loaded.set()
        for _ in range(200):
            if httpx.get(f"{srv.url}/health").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert post(srv, {"queries": ["item1"], "topk": 1}).json()["result"][0][0]["id"] == "1"

    failures = []

    def broken_loader() -> RetrievalEngine:
        raise FileNotFoundError("e5_Flat.index")

    with BackgroundServer(create_app(ServerConfig(), loader=broken_loader, on_load_failed=failures.append)) as srv:
        for _ in range(200):
            if failures:
                break
            threading.Event().wait(0.05)
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        assert "FileNotFoundError" in r.json()["detail"] and "e5_Flat.index" not in r.json()["detail"]
    assert isinstance(failures[0], FileNotFoundError)


@pytest.mark.parametrize(
    ("device", "flag", "threads"), [("cpu", None, 40), ("cuda", None, 1), ("cuda", 6, 6), ("cpu", 3, 3)]
)
def test_the_per_request_pool_defaults_by_the_encoders_device(animal_corpus, make_hash_engine, device, flag, threads):
    """40 threads on a CPU; on a GPU one (concurrent single-query passes only contend there); the flag wins."""
    engine = make_hash_engine(animal_corpus)
    engine.backend.encoder.device = torch.device(device)  # no GPU here: the runner only reads where encoding runs
    config = ServerConfig(batching=False, **({} if flag is None else {"unbatched_threads": flag}))
    state = ServiceState(config)
    state.set_ready(engine)
    try:
        assert engine.encodes_on_gpu is (device == "cuda")
        assert state.runner.threads == threads
    finally:
        asyncio.run(state.runner.stop())


def test_unbatched_reference_mode_serves_the_same_results(engine):
    with BackgroundServer(create_app(ServerConfig(batching=False), engine=engine)) as srv:
        r = post(srv, {"queries": ["item7", "item8"], "topk": 1})
        assert [hits[0]["id"] for hits in r.json()["result"]] == ["7", "8"]
        assert httpx.get(f"{srv.url}/health").json()["batching"] is False
