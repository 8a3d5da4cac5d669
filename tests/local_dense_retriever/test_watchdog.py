"""The watchdog: a stuck worker or a blocked event loop is logged once, /health answers 503 while it lasts (so a
supervisor restarts the server), and SIGTERM ends the process even when the event loop cannot."""

from __future__ import annotations

import logging
import signal
import threading
import time

import httpx
import pytest

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.watchdog import FORCED_EXIT_STATUS, Watchdog


class Probe:
    """What the watchdog reads from the batcher, set by the test."""

    def __init__(self) -> None:
        self.stalled = 0.0

    def stalled_for(self, now: float) -> float:
        return self.stalled

    def describe(self) -> dict:
        return {"queued": 7}


def make_watchdog(probe: Probe, exits: list[int]) -> Watchdog:
    return Watchdog(stalled_for=probe.stalled_for, describe=probe.describe, stall_s=5.0, loop_block_s=1.0,
                    exit_grace_s=2.0, exit=exits.append)  # fmt: skip


def test_a_stall_is_logged_once_per_episode_and_clears(caplog):
    probe, exits = Probe(), []
    dog = make_watchdog(probe, exits)
    beat = dog._beat
    with caplog.at_level(logging.WARNING, logger="local_dense_retriever.watchdog"):
        assert dog.check(beat + 0.1) is None
        probe.stalled = 6.0
        for dt in (0.2, 0.3, 0.4):  # the loop beats; only the worker is stuck
            dog._beat = beat + dt
            assert "no progress for 6.0 s" in dog.check(beat + dt)
        probe.stalled = 0.0
        assert dog.check(beat + 0.5) is None
        probe.stalled = 9.0
        assert dog.check(beat + 0.6) is not None
    stuck = [r.getMessage() for r in caplog.records if "retriever stuck" in r.getMessage()]
    assert len(stuck) == 2 and dog.episodes == 2  # once per episode, not once per look
    assert "'queued': 7" in stuck[0]
    assert any("recovered" in r.getMessage() for r in caplog.records)
    assert exits == []


def test_sigterm_ends_the_process_only_when_the_blocked_loop_cannot():
    probe, exits = Probe(), []
    dog = make_watchdog(probe, exits)
    beat = dog._beat
    dog.terminate_requested()
    dog.check(beat + 0.5)  # loop alive: uvicorn drains as usual
    assert exits == [] and dog.problem is None
    dog._terminate_at = beat  # a SIGTERM at `beat`, and the loop has not run since
    assert "event loop has not run for 1.5 s" in dog.check(beat + 1.5)
    assert exits == []  # within the grace period
    dog.check(beat + 2.5)
    assert exits == [FORCED_EXIT_STATUS]


def test_a_check_run_on_the_loop_thread_sees_that_a_block_has_ended():
    probe, exits = Probe(), []
    dog = make_watchdog(probe, exits)
    dog._loop_thread = threading.get_ident()  # this thread plays the event loop's
    dog._beat = time.monotonic() - 1.5
    assert "event loop has not run" in dog.check(time.monotonic())  # the thread's look during the block
    assert dog.current_problem() is None  # the loop runs this call: the block is over
    seen: list = []
    other = threading.Thread(target=lambda: seen.append(dog.current_problem()))
    other.start()
    other.join()
    assert "event loop has not run" in seen[0]  # from another thread, with no beat since, it still lasts
    probe.stalled = 6.0
    assert "no progress for 6.0 s" in dog.current_problem()  # a stuck worker is seen from the loop too


def test_a_watchdog_that_is_not_watching_reports_no_blocked_loop():
    probe, exits = Probe(), []
    dog = make_watchdog(probe, exits)
    dog._beat = time.monotonic() - 5  # no heartbeat runs before start() or after stop()
    assert dog.current_problem() is None
    dog._loop_thread = threading.get_ident() + 1  # started on another thread
    assert "event loop has not run" in dog.current_problem()
    dog._stop.set()
    assert dog.current_problem() is None


def test_health_right_after_a_blocked_loop_recovers_is_200(animal_corpus, make_hash_engine):
    # the /health requests that arrive during the block are the first thing the loop runs when it ends, before the
    # heartbeat: they must not report the block that has just ended (Serve failed a replica's start-up this way)
    app = create_app(ServerConfig(watchdog_loop_block_s=0.5), engine=make_hash_engine(animal_corpus))

    async def block() -> dict:
        time.sleep(1.5)  # a stand-in for start-up work or a load spike that keeps the loop from running
        return {}

    app.add_api_route("/test-block", block)
    with BackgroundServer(app) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        blocker = threading.Thread(target=lambda: httpx.get(f"{srv.url}/test-block", timeout=30))
        blocker.start()
        time.sleep(0.3)
        during = httpx.get(f"{srv.url}/health", timeout=30)  # sent during the block, answered when it ends
        blocker.join(30)
        assert during.status_code == 200 and during.json()["status"] == "ready"
        assert app.state.service.watchdog.episodes == 1  # the block itself was seen and logged


def test_health_says_stuck_while_the_worker_makes_no_progress(animal_corpus, make_hash_engine, steerable_backend):
    engine = make_hash_engine(animal_corpus)
    gate = steerable_backend(engine.backend)
    config = ServerConfig(watchdog_stall_s=0.5, max_wait_ms=0)
    with BackgroundServer(create_app(config, engine=RetrievalEngine(gate, engine.corpus))) as srv:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        answers: dict = {}

        def call(i: int) -> None:
            answers[i] = httpx.post(f"{srv.url}/retrieve", json={"queries": [f"emu{i}"]}, timeout=60)

        calls = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in calls:  # the first is in the engine, the second waits behind it
            t.start()
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while (r := httpx.get(f"{srv.url}/health")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 503
        assert r.json()["status"] == "stuck" and "no progress" in r.json()["detail"]
        gate.release.set()
        for t in calls:
            t.join(30)
        assert [answers[i].status_code for i in range(2)] == [200, 200]
        deadline = time.monotonic() + 10
        while (r := httpx.get(f"{srv.url}/health")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["status"] == "ready"


BLOCKER = """
import sys, time
sys.path.insert(0, {repo!r})
from local_dense_retriever.batcher import Batcher
from local_dense_retriever.retrieval_server import main

submit = Batcher.submit


async def blocking_submit(self, queries, k):
    if queries == ["block the event loop"]:  # a stand-in for any bug that keeps the loop thread busy
        while True:
            time.sleep(0.05)
    return await submit(self, queries, k)


Batcher.submit = blocking_submit
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(300)
def test_a_blocked_event_loop_is_reported_and_sigterm_still_ends_the_server(
    tmp_path, animal_corpus, minilm_path, minilm_index, toy_dataset, start_cli_server
):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = tmp_path / "blocking_server.py"
    script.write_text(BLOCKER.format(repo=str(repo)))
    log = tmp_path / "server.log"
    args = ["--index_path", str(minilm_index["faiss"]), "--corpus_path", str(toy_dataset.corpus_path),
            "--retriever_name", "minilm", "--retriever_model", str(minilm_path)]  # fmt: skip
    proc, url = start_cli_server(args, log, script=[str(script)])
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/retrieve", json={"queries": ["block the event loop"]}, timeout=1)
        with pytest.raises(httpx.TimeoutException):  # nothing on the loop answers: a supervisor's probe fails
            httpx.get(f"{url}/health", timeout=2)
        deadline = time.monotonic() + 10
        while "retriever stuck" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log.read_text()
        assert "retriever stuck: the event loop has not run for" in text
        assert "blocking_submit" in text  # the log shows where the loop thread is stuck
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.wait(timeout=15)
        assert proc.returncode == FORCED_EXIT_STATUS and time.monotonic() - t0 < 8
        assert "exiting: a termination signal came" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
