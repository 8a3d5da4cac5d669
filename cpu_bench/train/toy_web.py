"""The toy world's web for ``make train --search web|web-replay``: a search API in Serper's shape
(``POST /search``) whose results are a retriever's passages, so the retriever's web backend can be trained against,
recorded and replayed on a machine with no paid API.

Each organic result is one passage: its title (the first line of ``contents``, unquoted), its url and its text as
the snippet, so the web backend's ``"title"\\nsnippet`` rebuilds the passage's own contents. Every call is counted.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cpu_bench.background_server import BackgroundServer
from cpu_bench.train.config import SearchBackend
from cpu_bench.train.processes import retrieval_server, retriever
from verl_search.errors import VerlSearchError

#: the key the toy web asks for (it stands for a paid provider's key; nothing secret)
TOY_KEY = "toy-web-key"


def organic(document: dict, position: int) -> dict:
    """A retriever document as one Serper organic result."""
    title, _, text = document.get("contents", "").partition("\n")
    return {"title": title.strip().strip('"'), "link": document.get("url", ""), "snippet": text, "position": position}


class ToyWeb(AbstractContextManager):
    """``with ToyWeb(retrieve_url) as web:`` serves ``web.url + "/search"`` until the block ends."""

    def __init__(self, retrieve_url: str, key: str = TOY_KEY) -> None:
        self.retrieve_url = retrieve_url
        self.key = key
        self.calls = 0  # searches answered (what a paid provider would have billed)
        self._lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None
        app = Starlette(routes=[Route("/search", self._search, methods=["POST"])], lifespan=self._lifespan)
        self._server = BackgroundServer(app)

    @property
    def url(self) -> str:
        return self._server.url

    @asynccontextmanager
    async def _lifespan(self, _app: Starlette):
        async with aiohttp.ClientSession() as self._session:
            yield

    async def _search(self, request: Request) -> JSONResponse:
        if request.headers.get("x-api-key") != self.key:
            return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
        try:
            body = json.loads(await request.body())
            query, num = body["q"], int(body.get("num", 10))
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"message": "Bad request: q is required.", "statusCode": 400}, status_code=400)
        assert self._session is not None
        async with self._session.post(self.retrieve_url, json={"queries": [query], "topk": num}) as resp:
            if resp.status != 200:
                return JSONResponse({"message": "Upstream error.", "statusCode": 502}, status_code=502)
            documents = (await resp.json())["result"][0]
        with self._lock:
            self.calls += 1
        results = [organic(doc, i + 1) for i, doc in enumerate(documents)]
        return JSONResponse({"searchParameters": {"q": query, "num": num, "type": "search"}, "organic": results})

    def __enter__(self) -> ToyWeb:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


class RecordingMissing(VerlSearchError, FileNotFoundError):
    """``--search web-replay`` was given no recorded cache; the message names the command that records one."""


@contextlib.contextmanager
def search_service(backend: SearchBackend, cache: Path, passages: int, logs: Path, scope: str) -> Iterator[str]:
    """Yield the ``/retrieve`` URL ``make train`` searches for ``backend`` 'web' or 'web-replay': the retriever's web
    backend over the toy web, recording every answer into ``cache`` ('web'), or answering from ``cache`` alone
    ('web-replay': no toy web, no dense retriever, no call)."""
    flags = ["--backend", "web", "--web_provider", "serper", "--web_cache_path", str(cache)]
    flags += ["--web_budget_scope", scope]
    if backend == "web-replay":
        if not cache.is_file():
            raise RecordingMissing(
                f"--search web-replay: no recorded web cache at {cache}; record one with --search web (it writes "
                "<out>/web_search.sqlite3) and pass it with --web_cache"
            )
        with retrieval_server([*flags, "--web_cache_mode", "replay"], logs / "web_search.log") as base:
            yield base + "/retrieve"
        return
    with retriever(None, passages, logs / "retriever.log") as dense, ToyWeb(dense) as web:
        # the toy web has no quota: a high rate keeps the data stage's thousands of first lookups quick
        flags += ["--web_base_url", web.url + "/search", "--web_qps", "1000"]
        with retrieval_server(flags, logs / "web_search.log", env={"SERPER_API_KEY": web.key}) as base:
            yield base + "/retrieve"


def web_report(retrieve_url: str) -> dict:
    """The web backend's counters (``/metrics``' web block) and what was saved: of the queries the server was asked
    (``queries``), those answered without a live call, by the engine's in-batch dedupe or by the cache (a replay miss
    or a budget refusal is not an answer)."""
    base = retrieve_url.removesuffix("/retrieve")
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        metrics = json.load(response)
    web, asked = metrics["web"], metrics["queries_total"]
    saved = asked - web["live_requests_total"] - web["replay_misses_total"] - web["budget_refusals_total"]
    return {**web, "queries": asked, "calls_saved": saved, "saved_share": saved / asked if asked else None}
