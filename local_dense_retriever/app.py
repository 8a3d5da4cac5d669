"""The HTTP layer: ``create_app`` builds the FastAPI service (POST /retrieve, POST /access, GET /health, GET /metrics,
docs).

Invariant: every request gets a JSON answer (results, or an ErrorResponse with a 4xx/5xx status, never raw error
text: a 500 names an error id and the cause goes to the log); a bad request never affects other requests or the
server. Model and index work never runs on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from local_dense_retriever.batcher import (
    Batcher,
    BatcherStopped,
    DirectRunner,
    Overloaded,
    QueryRejected,
    estimate_tokens,
)
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.memory import release_free_memory_every
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.middleware import GuardPostBodies, error_response, internal_error
from local_dense_retriever.watchdog import Watchdog
from verl_search.protocol import ErrorResponse, RetrieveResponse

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 408, 413, 422, 429, 500, 503)}


class RetrieveBody(BaseModel):
    """Body of ``POST /retrieve``: Search-R1's ``{"queries": [...]}``, or SkyRL's single ``{"query": "..."}``."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] | None = Field(default=None, description="One search string per query (may be empty).")
    query: str | None = Field(default=None, description="A single query (SkyRL); answered as a one-query request.")
    topk: StrictInt | None = Field(default=None, description="Passages per query; null takes the server default.")
    return_scores: bool = Field(default=False, description="Wrap each document as {document, score}.")


class AccessBody(BaseModel):
    """Body of ``POST /access`` (ASearcher): the pages of these URLs."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str]


class ServiceState:
    """Lifecycle of one server: loading → ready (engine + runner) or failed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.status = "loading"
        self.detail = "loading model, index and corpus"
        self.engine: RetrievalEngine | None = None
        self.runner: Batcher | DirectRunner | None = None
        self.watchdog = Watchdog(
            stalled_for=lambda now: self.runner.stalled_for(now) if self.runner is not None else 0.0,
            describe=lambda: self.runner.describe_state() if self.runner is not None else {"status": self.status},
            stall_s=config.watchdog_stall_s,
            loop_block_s=config.watchdog_loop_block_s,
        )

    @property
    def healthy(self) -> bool:
        """Ready, its worker running, and the watchdog sees nothing stuck (what a supervisor's check asks)."""
        runner = self.runner
        return self.status == "ready" and runner is not None and runner.running and self.watchdog.problem is None

    def set_ready(self, engine: RetrievalEngine) -> None:
        c = self.config
        if c.batching:
            self.runner = Batcher(
                engine.search,
                max_batch_size=c.max_batch_size,
                max_batch_tokens=c.max_batch_tokens,
                cost=functools.partial(estimate_tokens, cap=c.query_max_length),
                max_wait_s=c.max_wait_ms / 1000,
                max_queue=c.max_queue,
                metrics=self.metrics,
            )
        else:
            self.runner = DirectRunner(
                engine.search, threads=c.unbatched_threads, max_queue=c.max_queue, metrics=self.metrics
            )
        self.runner.start()
        self.metrics.cpu_seconds = engine.clock.snapshot
        self.engine = engine
        self.status, self.detail = "ready", engine.describe()


def _lone_surrogate(text: str) -> int | None:
    """Position of the first lone UTF-16 surrogate in ``text`` (legal in JSON, not text), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _validate(req: RetrieveBody, config: ServerConfig) -> str | None:
    """The reason ``req`` is out of the server's limits, or None when it is fine."""
    if (req.queries is None) == (req.query is None):
        return "send either 'queries' (a list of strings) or 'query' (one string)"
    queries = req.queries if req.queries is not None else [req.query]
    if len(queries) > config.max_queries_per_request:
        return f"{len(queries)} queries in one request; the limit is {config.max_queries_per_request}"
    for i, q in enumerate(queries):
        if len(q) > config.max_query_chars:
            return f"query {i} has {len(q)} characters; the limit is {config.max_query_chars}"
        if (pos := _lone_surrogate(q)) is not None:
            return (
                f"query {i} holds a lone UTF-16 surrogate ({q[pos]!a} at character {pos}), which is not text; "
                "send valid Unicode"
            )
    if req.topk is not None and not 1 <= req.topk <= config.max_topk:
        return f"topk must be between 1 and {config.max_topk}, got {req.topk}"
    return None


def health_report(state: ServiceState) -> dict:
    """The body of GET /health (its status code: 200 when ``state.healthy``, else 503)."""
    body = {"status": state.status, "detail": state.detail}
    if state.status == "ready" and not state.healthy:
        problem = state.watchdog.problem or "the batching worker is not running"
        body = {"status": "stuck", "detail": f"{problem}; restart the server if this lasts"}
    if state.engine is not None:
        body["passages"] = len(state.engine.corpus)
        body["batching"] = state.config.batching
        body["pages"] = len(state.engine.pages) if state.engine.pages is not None else None
    return body


def replica_report(state: ServiceState) -> dict:
    """What one server of a fleet tells the others (local_dense_retriever.serve): its /health body, whether it is
    healthy, and its /metrics body."""
    return {"health": health_report(state), "healthy": state.healthy, "metrics": state.metrics.snapshot()}


def create_app(
    config: ServerConfig,
    *,
    engine: RetrievalEngine | None = None,
    loader: Callable[[], RetrievalEngine] | None = None,
    on_load_failed: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The retrieval service. Give a loaded ``engine``, or a ``loader`` run in a thread at start-up (health says
    'loading' until it returns; if it raises, health says 'failed' and ``on_load_failed`` is called).
    ``on_ready`` is called once the service answers queries."""
    if (engine is None) == (loader is None):
        raise ValueError("create_app needs exactly one of engine= or loader=")
    state = ServiceState(config)

    def ready(loaded: RetrievalEngine) -> None:
        state.set_ready(loaded)
        if on_ready is not None:
            on_ready()

    async def load() -> None:
        try:
            loaded = await asyncio.to_thread(loader)
        except Exception as e:
            logger.error("loading failed: %s", e)
            state.status = "failed"
            state.detail = f"loading failed ({type(e).__name__}); the cause is in the server log"
            if on_load_failed is not None:
                on_load_failed(e)
            return
        ready(loaded)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.watchdog.start()
        trim_task = asyncio.create_task(release_free_memory_every(config.malloc_trim_s), name="retriever-malloc-trim")
        load_task = None
        if engine is not None:
            ready(engine)
        else:
            load_task = asyncio.create_task(load())
        yield
        if load_task is not None and not load_task.done():
            load_task.cancel()
        trim_task.cancel()
        if state.runner is not None:
            await state.runner.stop()
        await state.watchdog.stop()

    app = FastAPI(
        title="verl-search local retriever",
        version="0.1.0",
        lifespan=lifespan,
        description="Search-R1 compatible retrieval service with cross-request dynamic batching.",
    )
    app.state.service = state
    app.add_middleware(GuardPostBodies, state=state)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "invalid_json", "request body is not valid JSON", request)
        parts = [
            f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}" for e in errors[:5]
        ]
        return error_response(422, "invalid_request", "; ".join(parts), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail), request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(f"{request.method} {request.url.path}", exc, request)

    @app.post("/retrieve", response_model=RetrieveResponse, responses=_ERRORS)
    async def retrieve(req: RetrieveBody, request: Request) -> JSONResponse:
        """Top-k passages per query (DESIGN §3.1). With return_scores each hit is {document, score}.
        ``{"queries": []}`` answers ``{"result": []}``; SkyRL's ``{"query": str}`` answers one list of hits."""
        queries = req.queries if req.queries is not None else [req.query] if req.query is not None else []
        request.state.n_queries = len(queries)
        problem = _validate(req, config)
        if problem is not None:
            return error_response(422, "invalid_request", problem, request)
        if not queries:
            return JSONResponse({"result": []})
        if state.runner is None:
            return error_response(503, "not_ready", f"server is {state.status}: {state.detail}", request)
        try:
            hits = await state.runner.submit(queries, req.topk or config.topk)
        except Overloaded as e:
            return error_response(429, "overloaded", str(e), request)
        except BatcherStopped as e:
            return error_response(503, "unavailable", str(e), request)
        except QueryRejected as e:
            return error_response(422, "invalid_query", str(e), request)
        except Exception as e:  # the engine failed: this batch's callers get a 500, the server stays up
            return internal_error("retrieval", e, request)
        if req.return_scores:
            result = [[{"document": doc, "score": score} for doc, score in per_query] for per_query in hits]
        else:
            result = [[doc for doc, _ in per_query] for per_query in hits]
        return JSONResponse({"result": result})

    @app.post("/access", responses=_ERRORS)
    async def access(req: AccessBody, request: Request) -> JSONResponse:
        """ASearcher's page access: ``{"result": [page or null per url]}``: the page of ``--pages_path``, else the
        page joined from the corpus rows with that url (every hit's url has one: local_dense_retriever.page_urls)."""
        if len(req.urls) > config.max_queries_per_request:
            return error_response(422, "invalid_request", f"{len(req.urls)} urls; the limit is "
                                  f"{config.max_queries_per_request}", request)  # fmt: skip
        if state.engine is None:
            return error_response(503, "not_ready", f"server is {state.status}: {state.detail}", request)
        engine = state.engine
        try:
            result = await asyncio.to_thread(lambda: [engine.page(url) for url in req.urls])
        except Exception as e:
            return internal_error("page access", e, request)
        return JSONResponse({"result": result})

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 once model, index and corpus are loaded and the service is not stuck; 503 while loading, after a
        failed load, when the batching worker has stopped, or while the watchdog sees the service stuck."""
        return JSONResponse(health_report(state), status_code=200 if state.healthy else 503)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        """Requests, statuses, queue depth, batch-size histogram, latency percentiles (ms), CPU seconds per engine
        stage, the C heap's bytes."""
        return JSONResponse(state.metrics.snapshot())

    return app
