"""A local stub of the web search providers (Serper, SerpAPI, Brave) on 127.0.0.1, answering in their documented
shapes, with a plan of faults to give next; and helpers that build a web backend or a whole server against it."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import pytest

from cpu_bench.background_server import BackgroundServer

#: the key every test sets; tests grep for it in files, logs and answers
SECRET = "sk-test-5e3f9b1c7a2d4e6f8091"

#: what a provider's stub sends for an error: (status, JSON body) in its documented error shape
ERROR_BODIES = {
    "serper": lambda status, msg: {"message": msg, "statusCode": status},
    "serpapi": lambda status, msg: {"error": msg},
    "brave": lambda status, msg: {
        "type": "ErrorResponse",
        "error": {"id": "x", "status": status, "code": "SUBSCRIPTION_TOKEN_INVALID", "detail": msg},
    },
}


@dataclass
class Fault:
    """One planned answer: ``status`` with the provider's error body (``message``; ``{target}`` in it is replaced by
    the request's path and query string as received, ``{headers}`` by its headers as JSON), ``raw`` bytes as a 200, or
    ``hang`` (never answers until the stub closes, or ``until`` is set); ``retry_after`` sets that header, ``headers``
    adds others."""

    status: int = 200
    message: str = ""
    raw: bytes | None = None
    retry_after: str | None = None
    hang: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    until: threading.Event | None = None


@dataclass
class ProviderStub:
    """Answers as ``provider`` would; ``plan`` holds faults for the next requests, then it answers normally: top k
    hits made from the query. Every request is recorded (method, path, params, headers, JSON body)."""

    provider: str = "serper"
    plan: deque[Fault] = field(default_factory=deque)
    requests: list[dict] = field(default_factory=list)
    delay_s: float = 0.0
    #: when set, each request waits until it is set (a test holds a call in flight with it)
    gate: threading.Event | None = None
    closing: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def reset(self, provider: str) -> None:
        self.provider, self.delay_s, self.gate = provider, 0.0, None
        self.plan.clear()
        self.requests.clear()

    def answer(self, query: str, k: int) -> dict:
        hits = [(f"{query} page {i}", f"https://example.org/{query.replace(' ', '-')}/{i}", f"About {query}, {i}.")
                for i in range(k)]  # fmt: skip
        if self.provider == "serper":
            organic = [{"title": t, "link": u, "snippet": s, "position": i + 1} for i, (t, u, s) in enumerate(hits)]
            return {"searchParameters": {"q": query, "num": k}, "organic": organic, "credits": 1}
        if self.provider == "serpapi":
            organic = [{"position": i + 1, "title": t, "link": u, "snippet": s} for i, (t, u, s) in enumerate(hits)]
            return {"search_metadata": {"status": "Success"}, "organic_results": organic}
        results = [{"title": t, "url": u, "description": f"<strong>{s}</strong> &amp; more"} for t, u, s in hits]
        return {"type": "search", "web": {"type": "search", "results": results}}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        params = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        payload = json.loads(body) if body else None
        self.requests.append(
            {"method": scope["method"], "path": scope["path"], "params": params, "headers": headers, "json": payload}
        )
        fault = self.plan.popleft() if self.plan else Fault()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        while self.gate is not None and not self.gate.is_set() and not self.closing.is_set():
            await asyncio.sleep(0.01)
        if fault.hang:
            while not self.closing.is_set():
                await asyncio.sleep(0.05)
            return
        while fault.until is not None and not fault.until.is_set() and not self.closing.is_set():
            await asyncio.sleep(0.01)
        if fault.raw is not None:
            status, data = fault.status, fault.raw
        elif fault.status != 200:
            target = scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
            message = fault.message.replace("{target}", target).replace("{headers}", json.dumps(headers))
            status, data = fault.status, json.dumps(ERROR_BODIES[self.provider](fault.status, message)).encode()
        else:
            query = payload["q"] if payload else params["q"]
            k = int(payload["num"] if payload else params.get("num") or params.get("count"))
            status, data = 200, json.dumps(self.answer(query, k)).encode()
        head = [(b"content-type", b"application/json")]
        if fault.retry_after is not None:
            head.append((b"retry-after", fault.retry_after.encode()))
        head += [(name.encode(), value.encode()) for name, value in fault.headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": data})


@pytest.fixture(scope="session")
def provider_server():
    stub = ProviderStub()
    with BackgroundServer(stub, timeout_graceful_shutdown=1) as server:
        stub.url = server.url
        yield stub
        stub.closing.set()


@pytest.fixture(params=["serper"])
def provider(request, provider_server, monkeypatch) -> ProviderStub:
    """The stub, answering as the parametrised provider (serper unless a test parametrises ``provider``), with the
    API key in that provider's default variable."""
    provider_server.reset(request.param)
    env = {"serper": "SERPER_API_KEY", "serpapi": "SERPAPI_API_KEY", "brave": "BRAVE_API_KEY"}[request.param]
    monkeypatch.setenv(env, SECRET)
    return provider_server


@pytest.fixture
def web_config(provider, tmp_path):
    """Factory: ServerConfig overrides -> a --backend web config aimed at the stub, its cache in ``tmp_path``."""
    from local_dense_retriever.config import ServerConfig

    def make(**overrides):
        raw = {
            "backend": "web",
            "web_provider": provider.provider,
            "web_base_url": f"{provider.url}/search",
            "web_cache_path": tmp_path / "web.sqlite3",
            "web_timeout_s": 3.0,
            "web_qps": 1000.0,
            "cache_dir": tmp_path,
        }
        raw.update(overrides)
        return ServerConfig(**raw)

    return make


@pytest.fixture
def web_backend(web_config):
    """Factory: overrides -> a WebSearch against the stub (closed after the test)."""
    from local_dense_retriever.web.backend import WebSearch

    made = []

    def make(**overrides):
        backend = WebSearch(web_config(**overrides))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def web_server(web_config):
    """Factory: overrides -> (base url, engine) of the real retrieval service on the web backend (uvicorn on
    127.0.0.1), stopped after the test."""
    from local_dense_retriever.app import create_app
    from local_dense_retriever.engine import load_engine

    servers = []

    def start(**overrides):
        config = web_config(**overrides)
        engine = load_engine(config, progress=False)
        server = BackgroundServer(create_app(config, engine=engine)).__enter__()
        servers.append((server, engine))
        return server.url, engine

    yield start
    for server, engine in servers:
        server.__exit__(None, None, None)
        engine.backend.close()


@pytest.fixture
def only_loopback_connections(monkeypatch) -> list[tuple[str, int]]:
    """Any connection this process opens to an address off this machine fails the test; the (host, port) of every
    connection it opens is recorded in the list returned."""
    opened: list[tuple[str, int]] = []
    real_create = asyncio.base_events.BaseEventLoop.create_connection
    real_socket_create = socket.create_connection

    def check(host, port) -> None:
        if host is None:  # an already connected socket
            return
        if not ipaddress.ip_address(str(host)).is_loopback:
            raise AssertionError(f"a connection to {host} was attempted")
        opened.append((str(host), int(port)))

    async def create_connection(self, protocol_factory, host=None, port=None, **kw):
        check(host, port)
        return await real_create(self, protocol_factory, host, port, **kw)

    def socket_create(address, *args, **kw):
        check(*address[:2])
        return real_socket_create(address, *args, **kw)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "create_connection", create_connection)
    monkeypatch.setattr(socket, "create_connection", socket_create)
    return opened


@pytest.fixture(scope="session")
def secret() -> str:
    """The API key every test sets."""
    return SECRET


@pytest.fixture(scope="session")
def fault() -> type[Fault]:
    """The class of a planned stub answer."""
    return Fault
