"""Clients that hang up at any point of a request never take the retriever down (issue 25), on the real server.

The published command runs in its own process (real uvicorn, MiniLM, faiss) while hundreds of clients hang up before
their body, after it, after ``100 Continue`` and while their micro-batch runs, interleaved with normal clients and a
health probe. What a user would notice is asserted: every normal request is answered correctly, /health answers
throughout, the queue drains, the process goes back to idle, and SIGTERM stops it within seconds.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import threading
import time

import httpx
import pytest

HANGUPS_PER_THREAD = 200
HANGUP_THREADS = 2


def _request(body: bytes, *, expect: bool = False) -> bytes:
    head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Expect: 100-continue\r\n" if expect else "") + "\r\n").encode()


def hang_up(port: int, rng: random.Random, queries: list[str]) -> str:
    """One client that goes away at a random point of its request; returns where."""
    n = rng.choice([1, 1, 2, 40])  # 40 queries span several micro-batches of --max_batch_size 16
    body = json.dumps({"queries": [rng.choice(queries) for _ in range(n)], "topk": 3}).encode()
    where = rng.choice(["before_body", "after_body", "after_continue", "body_after_continue", "mid_batch"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if where == "before_body":
            sock.sendall(_request(body) + body[: rng.randrange(len(body))])
        elif where in ("after_continue", "body_after_continue"):
            sock.sendall(_request(body, expect=True))
            assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")
            if where == "body_after_continue":
                sock.sendall(body)
        elif where == "after_body":
            sock.sendall(_request(body) + body)
            time.sleep(rng.uniform(0, 0.02))
        else:  # while its micro-batches run
            sock.sendall(_request(body) + body)
            time.sleep(rng.uniform(0.005, 0.06))
        if rng.random() < 0.5:  # an abortive close (RST) as well as an orderly one
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return where


@pytest.fixture
def server(tmp_path, minilm_index, toy_dataset, minilm_path, start_cli_server, cpu_seconds):
    args = ["--index_path", str(minilm_index["faiss"]), "--corpus_path", str(toy_dataset.corpus_path), "--topk", "3",
            "--retriever_name", "minilm", "--retriever_model", str(minilm_path), "--max_batch_size", "16",
            # float32: a query's answer then does not depend on its batch-mates (in bfloat16, chosen on CPUs with AMX,
            # its scores move by up to ~2e-3 with them and near ties swap), so "answered correctly" is exact
            "--encoder_dtype", "float32"]  # fmt: skip
    log = tmp_path / "server.log"
    proc, url = start_cli_server(args, log)
    yield proc, url, log, cpu_seconds
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_clients_hanging_up_anywhere_never_stall_the_server(server, toy_questions):
    proc, url, log, cpu_seconds = server
    port = int(url.rsplit(":", 1)[1])
    queries = [q["question"] for q in toy_questions[:40]]
    with httpx.Client(base_url=url, timeout=30) as client:  # what each query must get, from a quiet server
        expected = {q: client.post("/retrieve", json={"queries": [q], "topk": 3}).json()["result"][0] for q in queries}
    stop = threading.Event()
    problems: list[str] = []
    answered = [0, 0, 0]  # per normal client
    health_checks = [0]
    kinds: dict[str, int] = {}

    def normal_client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                asked = rng.sample(queries, rng.choice([1, 3]))
                try:
                    r = client.post("/retrieve", json={"queries": asked, "topk": 3})
                except httpx.HTTPError as e:
                    problems.append(f"normal request failed: {e!r}")
                    continue
                if r.status_code != 200 or r.json()["result"] != [expected[q] for q in asked]:
                    problems.append(f"normal request got {r.status_code}: {r.text[:200]}")
                answered[seed] += 1

    def prober() -> None:
        with httpx.Client(base_url=url, timeout=2) as client:
            while not stop.wait(0.1):
                try:
                    status = client.get("/health").status_code
                except httpx.HTTPError as e:
                    problems.append(f"/health did not answer: {e!r}")
                    continue
                if status != 200:
                    problems.append(f"/health answered {status}")
                health_checks[0] += 1

    def hanger(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(HANGUPS_PER_THREAD):
            where = hang_up(port, rng, queries)
            kinds[where] = kinds.get(where, 0) + 1

    others = [threading.Thread(target=normal_client, args=(i,)) for i in range(3)] + [threading.Thread(target=prober)]
    hangers = [threading.Thread(target=hanger, args=(100 + i,)) for i in range(HANGUP_THREADS)]
    for t in others + hangers:
        t.start()
    for t in hangers:
        t.join(300)
    stop.set()
    for t in others:
        t.join(60)
    assert not any(t.is_alive() for t in others + hangers), "a client thread never finished"
    assert problems == []
    assert sum(kinds.values()) == HANGUP_THREADS * HANGUPS_PER_THREAD and len(kinds) == 5
    # every normal client kept being answered among the hang-ups (how many times depends on the machine's load: 19 in
    # all when the suite ran on three workers on two cores, so a floor per client, not a total)
    assert min(answered) >= 3 and health_checks[0] >= 5, (answered, health_checks)

    deadline = time.monotonic() + 15
    while (metrics := httpx.get(f"{url}/metrics").json())["queue_depth"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metrics["queue_depth"] == 0
    assert metrics["errors_by_kind"].get("client_disconnected", 0) > 50  # the hang-ups reached the server

    before = cpu_seconds(proc.pid)
    time.sleep(2.0)
    assert cpu_seconds(proc.pid) - before < 0.3, "the server keeps burning CPU with no client"

    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    proc.wait(timeout=15)
    assert proc.returncode == 0 and time.monotonic() - t0 < 10
    text = log.read_text()
    assert "queue count disagreed" not in text and "retriever stuck" not in text, text[-2000:]
