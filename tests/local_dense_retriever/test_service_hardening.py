"""The service under hostile or heavy clients, on a real uvicorn server: fairness between a whole rollout turn and
single queries, clients that go away, slow bodies, malformed HTTP, and ASearcher's url/page contract."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine


class GatedBackend:
    """Each engine call takes one permit (given by the test) and records its queries."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.permits = threading.Semaphore(0)
        self.calls: list[list[str]] = []

    def __len__(self) -> int:
        return len(self.inner)

    def describe(self) -> str:
        return "gated"

    def search(self, queries, k):
        self.calls.append(list(queries))
        if not self.permits.acquire(timeout=30):
            raise RuntimeError("test gate never opened")
        return self.inner.search(queries, k)


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def _serve_until_answered(backend: GatedBackend, small: threading.Thread, query: str) -> tuple[int, int]:
    """Open the gate one engine call at a time until ``small`` is answered; (index of the first call started after
    the query was queued, index of the call that carried it)."""
    queued_at = len(backend.calls)  # the call in flight now holds no query of the newcomer
    while small.is_alive():
        started = len(backend.calls)
        backend.permits.release()
        _wait_for(lambda n=started: not small.is_alive() or len(backend.calls) > n, "the next engine call or answer")
    small.join(30)
    carried = next(i for i, call in enumerate(backend.calls) if query in call)
    return queued_at, carried


@pytest.fixture(scope="module")
def engine(animal_corpus, make_hash_engine) -> RetrievalEngine:
    return make_hash_engine(animal_corpus)


def test_a_whole_rollout_turn_does_not_hold_up_single_queries(engine):
    backend = GatedBackend(engine.backend)
    config = ServerConfig(max_batch_size=64, max_wait_ms=0)  # default request bound: 2,560 queries
    with BackgroundServer(create_app(config, engine=RetrievalEngine(backend, engine.corpus))) as srv:
        big: dict[str, httpx.Response] = {}
        body = {"queries": [f"item{i % 50}" for i in range(2560)], "topk": 1}
        t = threading.Thread(target=lambda: big.update(r=httpx.post(f"{srv.url}/retrieve", json=body, timeout=60)))
        t.start()
        _wait_for(lambda: backend.calls, "the big request reaches the engine")
        depth = lambda: httpx.get(f"{srv.url}/metrics").json()["queue_depth"]  # noqa: E731
        for i in range(5):  # a stream of single-query requests while the big one is served
            small: dict[str, httpx.Response] = {}
            before = depth()  # stable: no batch is taken while the engine call in flight waits for its permit
            s = threading.Thread(
                target=lambda i=i, small=small: small.update(
                    r=httpx.post(f"{srv.url}/retrieve", json={"queries": [f"item{i} probe{i}"], "topk": 1}, timeout=60)
                )
            )
            s.start()
            _wait_for(lambda before=before: depth() == before + 1, "the single query is queued")
            queued_at, carried = _serve_until_answered(backend, s, f"item{i} probe{i}")
            assert small["r"].json()["result"][0][0]["id"] == str(i)
            # answered by the first micro-batch after it arrived, while most of the 2,560 queries still wait
            assert carried == queued_at and t.is_alive(), "the single query waited for the rest of the big request"
        for _ in range(200):
            backend.permits.release()
        t.join(60)
        result = big["r"].json()["result"]
        assert len(result) == 2560 and [hits[0]["id"] for hits in result[:50]] == [str(i) for i in range(50)]
        assert max(len(c) for c in backend.calls) <= 64


def test_work_of_clients_that_went_away_is_dropped(engine):
    backend = GatedBackend(engine.backend)
    config = ServerConfig(max_wait_ms=0, max_queue=200, max_queries_per_request=100)
    with BackgroundServer(create_app(config, engine=RetrievalEngine(backend, engine.corpus))) as srv:
        first = threading.Thread(target=lambda: httpx.post(f"{srv.url}/retrieve", json={"queries": ["emu"]}))
        first.start()
        _wait_for(lambda: backend.calls, "the first request is in the engine")
        socks = []
        for i in range(4):  # four clients queue 40 queries each, then hang up
            body = json.dumps({"queries": [f"gone{i}x{j}" for j in range(40)]}).encode()
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            socks.append(sock)
        metrics = lambda: httpx.get(f"{srv.url}/metrics").json()  # noqa: E731
        _wait_for(lambda: metrics()["queue_depth"] == 160, "the 160 queries are queued")
        assert httpx.post(f"{srv.url}/retrieve", json={"queries": ["x"] * 50}).status_code == 429
        for sock in socks:
            sock.close()
        _wait_for(lambda: metrics()["queue_depth"] == 0, "the queue forgets the clients that went away")
        late = {}
        retry = {"queries": ["x"] * 50}
        t = threading.Thread(target=lambda: late.update(r=httpx.post(f"{srv.url}/retrieve", json=retry)))
        t.start()  # the queue has room again: no 429 for work nobody waits for
        for _ in range(5):
            backend.permits.release()
        first.join(30)
        t.join(30)
        assert late["r"].status_code == 200
        assert not any(q.startswith("gone") for call in backend.calls for q in call)
        assert metrics()["errors_by_kind"].get("client_disconnected") == 4


def _raw(port: int, data: bytes, *, read_timeout: float = 30) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(read_timeout)
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_an_incomplete_body_times_out_with_a_json_408(engine):
    from local_dense_retriever.http_protocol import json_400_protocol as http_protocol

    config = ServerConfig(body_timeout_s=0.5)
    with BackgroundServer(create_app(config, engine=engine), http=http_protocol(0.5)) as srv:
        head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        status, headers, body = _raw(srv.port, head + b"{")  # 1 of 100 bytes, then silence
        assert status == 408 and json.loads(body)["error"] == "body_timeout"
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": ["item4"], "topk": 1})
        assert r.json()["result"][0][0]["id"] == "4"
        for partial in (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Le", b"POST /retr", b""):  # headers stall
            status, _, body = _raw(srv.port, partial)
            assert status == 408 and json.loads(body)["error"] == "header_timeout"
        with httpx.Client() as client:  # a keep-alive client that is slow between requests is not cut off mid-way
            for _ in range(2):
                assert client.post(f"{srv.url}/retrieve", json={"queries": ["item4"]}).status_code == 200
                time.sleep(0.7)


@pytest.mark.parametrize(
    "data",
    [b"GARBAGE\r\n\r\n", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", b"\x16\x03\x01\x02\x00"],
    ids=["not http", "bad content-length", "tls on a plain port"],
)
def test_malformed_http_gets_a_json_400(engine, data):
    from local_dense_retriever.http_protocol import json_400_protocol as http_protocol

    with BackgroundServer(create_app(ServerConfig(), engine=engine), http=http_protocol()) as srv:
        status, headers, body = _raw(srv.port, data)
        assert status == 400 and headers["content-type"].startswith("application/json")
        assert json.loads(body)["error"] == "bad_request"


@pytest.mark.parametrize(
    "body", [b"\xff\xfe not utf-8", b'{"queries": ["a"]', b"[1, 2", b'{"queries": ["\\ud800"'], ids=str
)
def test_malformed_json_gets_a_json_400(engine, body):
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as srv:
        for content_type in ("application/json", "text/plain", "application/json; charset=latin-1", None):
            headers = {"content-type": content_type} if content_type else {}
            r = httpx.post(f"{srv.url}/retrieve", content=body, headers=headers)
            assert r.status_code == 400 and r.json()["error"] == "invalid_json", (content_type, r.text)


def test_a_json_body_is_read_as_json_whatever_its_content_type(engine):
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as srv:
        for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
            r = httpx.post(f"{srv.url}/retrieve", content=b'{"queries": ["item8"], "topk": 1}', headers=headers)
            assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "8"


def test_hits_carry_url_and_title_and_access_serves_pages(tmp_path, make_hash_engine):
    from local_dense_retriever.pages import PageStore

    corpus = tmp_path / "wiki_corpus.jsonl"
    with open(corpus, "w") as f:
        for i, name in enumerate(["Aardvark", "Badger", "Camel"]):
            url = f"https://en.wikipedia.org/w/index.php?title={name}"
            f.write(json.dumps({"id": str(i), "contents": f'"{name}"\n{name} facts', "title": name, "url": url}) + "\n")
    pages = tmp_path / "wiki_webpages.jsonl"
    with open(pages, "w") as f:
        badger = "https://en.wikipedia.org/w/index.php?title=Badger"
        f.write(json.dumps({"url": badger, "contents": "Badgers dig."}) + "\n")
        f.write("not json\n")
        f.write(json.dumps({"url": "https://en.wikipedia.org/wiki/Camel", "contents": "Camels " * 1000}) + "\n")
    engine = make_hash_engine(corpus)
    engine.page_file = PageStore(pages, progress=False)
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as srv:
        hit = httpx.post(f"{srv.url}/retrieve", json={"queries": ["badger"], "topk": 1}).json()["result"][0][0]
        assert hit["title"] == "Badger" and hit["url"].endswith("title=Badger")
        urls = [
            "https://en.wikipedia.org/w/index.php/Badger",  # ASearcher reads index.php/ as index.php?title=
            "https://en.wikipedia.org/wiki/Camel",
            "https://en.wikipedia.org/wiki/Nothing",
        ]
        result = httpx.post(f"{srv.url}/access", json={"urls": urls}).json()["result"]
        assert result[0]["contents"] == "Badgers dig." and result[1]["contents"].startswith("Camels")
        assert result[2] is None
        assert httpx.post(f"{srv.url}/access", json={"urls": "x"}).status_code == 422
    assert PageStore(pages, progress=False).get("https://en.wikipedia.org/wiki/Camel") is not None  # table reused


def test_access_without_pages_answers_null_per_url(engine):
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as srv:
        assert httpx.post(f"{srv.url}/access", json={"urls": ["a", "b"]}).json() == {"result": [None, None]}


def test_long_queries_are_spread_over_token_bounded_calls(engine):
    """#14.3: one legal request of 64 queries x 4,096 characters used to be one engine call that every other client
    waited behind; it now runs as several calls bounded in tokens, and a single query gets in between them."""
    backend = GatedBackend(engine.backend)
    config = ServerConfig(max_wait_ms=0, max_batch_tokens=2048, query_max_length=256)
    with BackgroundServer(create_app(config, engine=RetrievalEngine(backend, engine.corpus))) as srv:
        long_body = {"queries": [f"item{i} " * 400 for i in range(64)], "topk": 1}
        assert max(len(q) for q in long_body["queries"]) <= 4096
        big: dict[str, httpx.Response] = {}
        t = threading.Thread(target=lambda: big.update(r=httpx.post(f"{srv.url}/retrieve", json=long_body, timeout=60)))
        t.start()
        _wait_for(lambda: backend.calls, "the long request reaches the engine")
        depth = lambda: httpx.get(f"{srv.url}/metrics").json()["queue_depth"]  # noqa: E731
        before = depth()
        small: dict[str, httpx.Response] = {}
        one = {"queries": ["emu"]}
        s = threading.Thread(target=lambda: small.update(r=httpx.post(f"{srv.url}/retrieve", json=one)))
        s.start()
        _wait_for(lambda: depth() == before + 1, "the single query is queued")
        queued_at, carried = _serve_until_answered(backend, s, "emu")
        assert small["r"].status_code == 200 and carried == queued_at and t.is_alive()
        for _ in range(64):
            backend.permits.release()
        t.join(60)
        assert big["r"].status_code == 200 and len(big["r"].json()["result"]) == 64
        assert all(len(c) <= 8 for c in backend.calls)  # 2048 tokens / 256 per long query
