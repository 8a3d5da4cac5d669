"""A tiny /retrieve server with fault modes, for tests, the demo and the tool benchmark (no model, no index).

Hits are the corpus passages sharing the most words with the query (or made up from the query when no corpus is
given). The fault plan is mutable while the server runs, and every request is counted, so tests can assert exactly
what was sent and retried. Invariant: runs on 127.0.0.1 only, in its own thread and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

FAULTS = ("ok", "slow", "500", "503", "429", "bad_json", "wrong_shape", "drop", "400")
_WORD = re.compile(r"\w+")


@dataclass
class StubState:
    """What the stub does next and what it has seen. ``fault`` applies to the next ``fault_count`` requests
    (-1 = all), then the stub answers normally again."""

    fault: str = "ok"
    fault_count: int = -1
    slow_seconds: float = 5.0
    retry_after: float | None = None
    requests: int = 0
    record_queries: bool = True
    queries: list[str] = field(default_factory=list)

    def set_fault(self, fault: str, count: int = -1, **kw: float) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose from {FAULTS}")
        self.fault, self.fault_count = fault, count
        for k, v in kw.items():
            setattr(self, k, v)

    def take_fault(self) -> str:
        if self.fault_count == 0:
            return "ok"
        if self.fault_count > 0:
            self.fault_count -= 1
        return self.fault


class StubIndex:
    """Word-overlap search over a small in-memory corpus of ``{"id", "contents"}`` rows."""

    def __init__(self, corpus: Sequence[dict] | None) -> None:
        self.corpus = list(corpus or [])
        self._words = [set(_WORD.findall(doc["contents"].lower())) for doc in self.corpus]

    def search(self, query: str, k: int) -> list[tuple[dict, float]]:
        if not self.corpus:
            return [
                ({"id": f"{query}#{i}", "contents": f'"{query}"\nPassage {i + 1} about {query}.'}, 1.0 / (i + 1))
                for i in range(k)
            ]
        q = set(_WORD.findall(query.lower()))
        scored = sorted(((len(q & w), -i) for i, w in enumerate(self._words)), reverse=True)[:k]
        return [(self.corpus[-neg_i], float(score)) for score, neg_i in scored]


def make_app(state: StubState, corpus: Sequence[dict] | None = None, default_topk: int = 3) -> web.Application:
    index = StubIndex(corpus)

    async def retrieve(request: web.Request) -> web.StreamResponse:
        state.requests += 1
        fault = state.take_fault()
        try:
            body = await request.json()
            queries, topk = body["queries"], body.get("topk") or default_topk
            scores = bool(body.get("return_scores", False))
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "invalid_request", "detail": "bad body"}, status=422)
        if state.record_queries:
            state.queries.extend(queries)
        if fault == "slow":
            await asyncio.sleep(state.slow_seconds)
        elif fault in ("500", "503", "429", "400"):
            headers = {"Retry-After": str(state.retry_after)} if state.retry_after is not None else None
            return web.json_response(
                {"error": "stub", "detail": f"stub fault {fault}"}, status=int(fault), headers=headers
            )
        elif fault == "bad_json":
            return web.Response(text="<html>not json", content_type="application/json")
        elif fault == "wrong_shape":
            return web.json_response({"results": [["oops"]]})
        elif fault == "drop":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 10_000
            await resp.prepare(request)
            await resp.write(b'{"result": [[{"document"')
            request.transport.close()
            return resp
        result = []
        for q in queries:
            hits = index.search(q, int(topk))
            result.append([{"document": d, "score": s} if scores else d for d, s in hits])
        return web.json_response({"result": result})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": state.requests, "queries": len(state.queries)})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


class StubServer:
    """Context manager: the stub on 127.0.0.1 and an ephemeral port, in a thread; ``.url`` is its base URL."""

    def __init__(self, corpus: Sequence[dict] | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = StubState()
        self.host, self._port = host, port
        self._app = make_app(self.state, corpus)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _start(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def __enter__(self) -> StubServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Instant /retrieve stub (no model) on 127.0.0.1.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--corpus_path", help="optional jsonl corpus ({id, contents} per line)")
    args = parser.parse_args(argv)
    corpus = None
    if args.corpus_path:
        with open(args.corpus_path, encoding="utf-8") as f:
            corpus = [json.loads(line) for line in f if line.strip()]
    web.run_app(
        make_app(StubState(record_queries=False), corpus), host=args.host, port=args.port, access_log=None, print=None
    )


if __name__ == "__main__":
    main()
