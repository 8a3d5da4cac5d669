"""The fleet's gateway on a real uvicorn server, in front of a real retriever app (hashing encoder, torch flat index)
that it reaches the way a Serve replica is reached: ``forward`` runs the request through the app in process. A dying
replica is the one seam faked: ``forward`` raises the error Ray raises for it."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

pytest.importorskip("ray")

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError  # noqa: E402

from cpu_bench.background_server import BackgroundServer  # noqa: E402
from local_dense_retriever.app import create_app  # noqa: E402
from local_dense_retriever.config import ServerConfig  # noqa: E402
from local_dense_retriever.serve.asgi_call import call_asgi  # noqa: E402
from local_dense_retriever.serve.deployments import replica_report  # noqa: E402
from local_dense_retriever.serve.fleet_view import FleetViewApp  # noqa: E402
from local_dense_retriever.serve.gateway import GatewayApp, replica_died  # noqa: E402


class Fleet:
    """A gateway over one live replica app; ``deaths`` makes the next calls die as a killed replica's would."""

    def __init__(self, engine, config: ServerConfig) -> None:
        self.replica = create_app(config, engine=engine)
        self.deaths: list[BaseException] = []
        self.calls = 0
        self.hold: asyncio.Event | None = None  # set: calls wait for it (a slow replica)
        self.cancelled = 0
        self.gateway = GatewayApp(config, self.forward)
        self.app = FleetViewApp(self.gateway, self.read_board, lambda: {"gateway": {"gw0": self.gateway.report()}})

    async def forward(self, request):
        self.calls += 1
        if self.deaths:
            raise self.deaths.pop(0)
        try:
            if self.hold is not None:
                await self.hold.wait()
            return await call_asgi(self.replica, request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def read_board(self) -> dict:
        report = replica_report(self.replica.state.service)
        return {"retriever": {"r1": {**report, "age_s": 0.5}}, "gateway": {}}

    async def __call__(self, scope, receive, send) -> None:
        """The gateway as Serve runs it, with the replica app's lifespan run beside it (Serve runs each in its
        replica)."""
        if scope["type"] == "lifespan":
            replica = self.replica.router.lifespan_context(self.replica)
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await replica.__aenter__()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await replica.__aexit__(None, None, None)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await self.app(scope, receive, send)


@pytest.fixture
def fleet(animal_corpus, make_hash_engine):
    config = ServerConfig(max_body_bytes=4096, body_timeout_s=1.0, max_wait_ms=1)
    fleet = Fleet(make_hash_engine(animal_corpus), config)
    with BackgroundServer(fleet) as server:
        fleet.url = server.url
        yield fleet


def test_requests_reach_the_replica_and_come_back_as_it_answered(fleet):
    ok = httpx.post(f"{fleet.url}/retrieve", json={"queries": ["heron"], "topk": 2, "return_scores": True})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 2
    assert "heron" in ok.json()["result"][0][0]["document"]["contents"]
    bad = httpx.post(f"{fleet.url}/retrieve", json={"queries": "heron"})
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"  # the replica's own error
    assert httpx.get(f"{fleet.url}/nowhere").status_code == 404
    assert fleet.gateway.counters.forwarded_total == 3


@pytest.mark.parametrize("death", [ActorDiedError(), ActorUnavailableError("unreachable", b"\0" * 16)])
def test_a_request_whose_replica_dies_is_retried_once_on_another(fleet, death):
    fleet.deaths = [death]
    r = httpx.post(f"{fleet.url}/retrieve", json={"queries": ["emu"]})
    assert r.status_code == 200 and r.json()["result"][0]
    assert fleet.calls == 2 and fleet.gateway.counters.retried_total == 1


def test_a_second_death_is_a_503_the_client_retries(fleet):
    fleet.deaths = [ActorDiedError(), ActorDiedError()]
    r = httpx.post(f"{fleet.url}/retrieve", json={"queries": ["emu"]})
    assert r.status_code == 503 and r.json()["error"] == "unavailable" and r.headers["retry-after"] == "1"
    assert fleet.gateway.counters.failed_after_retry_total == 1
    # the tool's client retries a 503: its next attempt is served
    fleet.deaths = [ActorDiedError(), ActorDiedError()]
    from verl_search import run_search
    from verl_search.tool.config import SearchToolConfig

    tool = SearchToolConfig(retrieval_service_url=[f"{fleet.url}/retrieve"], timeout=10, cache_size=0,
                            backoff_base=0.01)  # fmt: skip
    from verl_search.tool.client import RetrievalClient

    async def search():
        try:
            return await run_search(tool, ["emu"])
        finally:
            await RetrievalClient.close_all()

    outcome = asyncio.run(search())
    assert outcome.ok, outcome.text


def test_an_error_that_is_not_a_death_is_not_retried(fleet):
    fleet.deaths = [RuntimeError("a bug with /secret/path in it")]
    r = httpx.post(f"{fleet.url}/retrieve", json={"queries": ["emu"]})
    assert r.status_code == 500 and r.json()["error"] == "internal_error"
    assert "/secret/path" not in r.text and fleet.calls == 1


def test_replica_died_recognises_rays_errors_only():
    assert replica_died(ActorDiedError()) and replica_died(ActorUnavailableError("x", b"\0" * 16))
    wrapped = RayTaskError("forward", "traceback", ActorDiedError())
    assert replica_died(wrapped)
    assert not replica_died(RayTaskError("forward", "traceback", ValueError("bad")))
    assert not replica_died(ValueError("bad"))


def test_bodies_are_limited_at_the_gateway(fleet):
    big = httpx.post(f"{fleet.url}/retrieve", json={"queries": ["x" * 5000]})
    assert big.status_code == 413 and big.json()["error"] == "body_too_large"
    with socket.create_connection(("127.0.0.1", int(fleet.url.rsplit(":", 1)[1]))) as s:  # a body that never ends
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n"
                  b"\r\n{\"queries\":")  # fmt: skip
        s.settimeout(10)
        assert b" 408 " in s.recv(4096).split(b"\r\n")[0] + b" "
    assert fleet.calls == 0  # neither reached a replica


def test_expect_100_continue_is_served(fleet):
    body = b'{"queries": ["heron"]}'
    with socket.create_connection(("127.0.0.1", int(fleet.url.rsplit(":", 1)[1]))) as s:
        s.settimeout(10)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        assert s.recv(4096).startswith(b"HTTP/1.1 100")
        s.sendall(body)
        answer = b""
        while b"heron" not in answer:
            answer += s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")


def test_a_client_that_hangs_up_cancels_its_request_on_the_replica(fleet):
    fleet.hold = asyncio.Event()  # never set: the replica would take forever
    body = b'{"queries": ["heron"]}'
    with socket.create_connection(("127.0.0.1", int(fleet.url.rsplit(":", 1)[1]))) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        deadline = time.monotonic() + 10
        while fleet.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while fleet.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fleet.cancelled == 1 and fleet.gateway.counters.client_closed_total == 1
    fleet.hold = None  # and the gateway serves the next client
    assert httpx.post(f"{fleet.url}/retrieve", json={"queries": ["heron"]}).status_code == 200


def test_health_and_metrics_are_the_fleets(fleet):
    httpx.post(f"{fleet.url}/retrieve", json={"queries": ["heron"]})
    health = httpx.get(f"{fleet.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert health.json()["replicas"] == [{"replica": "r1", "status": "ready", "detail": health.json()["replicas"][0]
                                          ["detail"], "report_age_s": 0.5, "gpus": []}]  # fmt: skip
    assert health.json()["gpus"] == []  # a CPU fleet holds no GPU memory
    metrics = httpx.get(f"{fleet.url}/metrics").json()
    assert metrics["requests_total"] == 1 and metrics["replicas"][0]["replica"] == "r1"
    assert metrics["gateway"]["forwarded_total"] == 1  # this gateway's own counters, live


def test_health_is_a_json_503_while_the_board_does_not_answer(fleet):
    async def no_board():
        raise ActorDiedError()

    fleet.app.read_board = no_board
    for path in ("/health", "/metrics"):
        r = httpx.get(f"{fleet.url}{path}")
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
    assert httpx.post(f"{fleet.url}/retrieve", json={"queries": ["heron"]}).status_code == 200  # search goes on
