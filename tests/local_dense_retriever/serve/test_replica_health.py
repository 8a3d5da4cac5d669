"""A Serve replica whose batching worker is stuck fails its health check (Serve then replaces it, as it replaces the
killed replica of test_fleet), and passes it again once the worker moves."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("ray.serve")

from cpu_bench.background_server import BackgroundServer  # noqa: E402
from local_dense_retriever.app import create_app  # noqa: E402
from local_dense_retriever.config import ServerConfig  # noqa: E402
from local_dense_retriever.engine import RetrievalEngine  # noqa: E402
from local_dense_retriever.serve.deployments import Retriever  # noqa: E402


class Replica:
    """What Serve's health check sees of a replica after start-up: its app, built over a loaded engine."""

    def __init__(self, app) -> None:
        self._service = app

    def check_health(self) -> None:
        Retriever.check_health(self)


def test_a_stuck_replica_fails_its_health_check_until_it_moves(animal_corpus, make_hash_engine, steerable_backend):
    engine = make_hash_engine(animal_corpus)
    gate = steerable_backend(engine.backend)
    app = create_app(ServerConfig(watchdog_stall_s=0.3, max_wait_ms=0), engine=RetrievalEngine(gate, engine.corpus))
    replica = Replica(app)
    with BackgroundServer(app) as srv:
        replica.check_health()  # healthy: no exception
        calls = [
            threading.Thread(target=httpx.post, args=(f"{srv.url}/retrieve",), kwargs={"json": {"queries": [q]}})
            for q in ("emu", "heron")
        ]
        for t in calls:
            t.start()
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                replica.check_health()
            except RuntimeError as e:
                assert "no progress" in str(e)
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the stuck replica kept passing its health check")
        gate.release.set()
        for t in calls:
            t.join(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                replica.check_health()
                break
            except RuntimeError:
                time.sleep(0.05)
        replica.check_health()
