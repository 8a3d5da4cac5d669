"""The HTTP layer: ``create_app`` builds the FastAPI service (POST /retrieve, GET /health, GET /metrics, docs).

Invariant: every request gets a JSON answer (results, or an ErrorResponse with a 4xx/5xx status); a bad request
never affects other requests or the server. Model and index work never runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from local_dense_retriever.batcher import Batcher, BatcherStopped, DirectRunner, Overloaded
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.metrics import Metrics
from verl_search.protocol import ErrorResponse, RetrieveRequest, RetrieveResponse

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 413, 422, 429, 500, 503)}


def error_response(status: int, error: str, detail: str, request: Request | None = None) -> JSONResponse:
    """An ErrorResponse body; also labels the request for /metrics."""
    if request is not None:
        request.state.error = error
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(ErrorResponse(error=error, detail=detail).model_dump(), status_code=status, headers=headers)


class ServiceState:
    """Lifecycle of one server: loading → ready (engine + runner) or failed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.status = "loading"
        self.detail = "loading model, index and corpus"
        self.engine: RetrievalEngine | None = None
        self.runner: Batcher | DirectRunner | None = None

    def set_ready(self, engine: RetrievalEngine) -> None:
        c = self.config
        if c.batching:
            self.runner = Batcher(
                engine.search,
                max_batch_size=c.max_batch_size,
                max_wait_s=c.max_wait_ms / 1000,
                max_queue=c.max_queue,
                metrics=self.metrics,
            )
        else:
            self.runner = DirectRunner(
                engine.search, threads=c.unbatched_threads, max_queue=c.max_queue, metrics=self.metrics
            )
        self.runner.start()
        self.engine = engine
        self.status, self.detail = "ready", engine.describe()


class _BodyLimitAndMetrics:
    """ASGI middleware: refuses bodies over the limit with 413 and records each /retrieve call in the metrics."""

    def __init__(self, app, state: ServiceState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/retrieve":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        status = 500
        limit = self.state.config.max_body_bytes
        body, more, too_big = b"", True, False
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > limit:
            too_big = True
        while more and not too_big:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            too_big = len(body) > limit

        async def replay():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if too_big:
                scope["state"]["error"] = "body_too_large"
                await error_response(413, "body_too_large", f"request body exceeds {limit} bytes")(
                    scope, replay, send_status
                )
            else:
                await self.app(scope, replay, send_status)
        finally:
            st = scope["state"]
            self.state.metrics.observe_request(
                status, time.perf_counter() - t0, st.get("n_queries", 0), st.get("error")
            )


def _validate(req: RetrieveRequest, config: ServerConfig) -> str | None:
    """The reason ``req`` is out of the server's limits, or None when it is fine."""
    if not req.queries:
        return "queries must be a non-empty list of strings"
    if len(req.queries) > config.max_queries_per_request:
        return f"{len(req.queries)} queries in one request; the limit is {config.max_queries_per_request}"
    for i, q in enumerate(req.queries):
        if len(q) > config.max_query_chars:
            return f"query {i} has {len(q)} characters; the limit is {config.max_query_chars}"
    if req.topk is not None and not 1 <= req.topk <= config.max_topk:
        return f"topk must be between 1 and {config.max_topk}, got {req.topk}"
    return None


def create_app(
    config: ServerConfig,
    *,
    engine: RetrievalEngine | None = None,
    loader: Callable[[], RetrievalEngine] | None = None,
    on_load_failed: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The retrieval service. Give a loaded ``engine``, or a ``loader`` run in a thread at start-up (health says
    'loading' until it returns; if it raises, health says 'failed' and ``on_load_failed`` is called)."""
    if (engine is None) == (loader is None):
        raise ValueError("create_app needs exactly one of engine= or loader=")
    state = ServiceState(config)

    async def load() -> None:
        try:
            loaded = await asyncio.to_thread(loader)
        except Exception as e:
            logger.error("loading failed: %s", e)
            state.status, state.detail = "failed", f"{type(e).__name__}: {e}"
            if on_load_failed is not None:
                on_load_failed(e)
            return
        state.set_ready(loaded)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        load_task = None
        if engine is not None:
            state.set_ready(engine)
        else:
            load_task = asyncio.create_task(load())
        yield
        if load_task is not None and not load_task.done():
            load_task.cancel()
        if state.runner is not None:
            await state.runner.stop()

    app = FastAPI(
        title="verl-search local retriever",
        version="0.1.0",
        lifespan=lifespan,
        description="Search-R1 compatible retrieval service with cross-request dynamic batching.",
    )
    app.state.service = state
    app.add_middleware(_BodyLimitAndMetrics, state=state)

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
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail), request)

    @app.post("/retrieve", response_model=RetrieveResponse, responses=_ERRORS)
    async def retrieve(req: RetrieveRequest, request: Request) -> JSONResponse:
        """Top-k passages per query (DESIGN §3.1). With return_scores each hit is {document, score}."""
        request.state.n_queries = len(req.queries)
        problem = _validate(req, config)
        if problem is not None:
            return error_response(422, "invalid_request", problem, request)
        if state.runner is None:
            return error_response(503, "not_ready", f"server is {state.status}: {state.detail}", request)
        try:
            hits = await state.runner.submit(req.queries, req.topk or config.topk)
        except Overloaded as e:
            return error_response(429, "overloaded", str(e), request)
        except BatcherStopped as e:
            return error_response(503, "unavailable", str(e), request)
        except Exception as e:  # the engine failed: this batch's callers get a 500, the server stays up
            return error_response(500, "internal_error", f"{type(e).__name__}: {e}", request)
        if req.return_scores:
            result = [[{"document": doc, "score": score} for doc, score in per_query] for per_query in hits]
        else:
            result = [[doc for doc, _ in per_query] for per_query in hits]
        return JSONResponse({"result": result})

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 once model, index and corpus are loaded; 503 while loading or after a failed load."""
        body = {"status": state.status, "detail": state.detail}
        if state.engine is not None:
            body["passages"] = len(state.engine.corpus)
            body["batching"] = config.batching
        return JSONResponse(body, status_code=200 if state.status == "ready" else 503)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        """Requests, statuses, queue depth, batch-size histogram, latency percentiles (ms)."""
        return JSONResponse(state.metrics.snapshot())

    return app
