"""The HTTP layer: ``create_app`` builds the service (POST /retrieve, POST /access, GET /health, GET /metrics, docs).
Invariant: every request gets a JSON answer (a 500 names an error id; the cause goes to the log); a bad request never
affects others; model and index work never runs on the event loop."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from local_dense_retriever.batcher import Batcher, estimate_tokens
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.memory import gpu_report, release_free_memory_every
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.middleware import GuardPostBodies, error_response, internal_error
from local_dense_retriever.request_runners import DocumentRunner, PerRequestRunner
from local_dense_retriever.retrieve import (
    JsonLane,
    RetrieveBody,
    RetrieveEndpoint,
    invalid_body_response,
    json_ok,
    refuse,
)
from local_dense_retriever.watchdog import Watchdog
from verl_search.protocol import ErrorResponse, RetrieveResponse

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 408, 413, 422, 429, 500, 502, 503)}


class AccessBody(BaseModel):
    """Body of ``POST /access`` (ASearcher): the pages of these URLs."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str]


class RetrieverApp(FastAPI):
    """FastAPI with its guarded POST endpoints (``guard``: body limits, hang-ups, /metrics) taken in front of it."""

    guard: GuardPostBodies

    async def __call__(self, scope, receive, send) -> None:
        await self.guard(scope, receive, send)

    async def fastapi_stack(self, scope, receive, send) -> None:
        """FastAPI's handling of a request (what ``guard`` runs for every request it does not take)."""
        await super().__call__(scope, receive, send)


class AccessEndpoint(JsonLane):
    """POST /access: per url, its page or null (``RetrievalEngine.pages``)."""

    model = AccessBody

    async def respond(self, req: AccessBody, labels: dict) -> Response:
        """The answer to a parsed body (also the FastAPI route's)."""
        state, config = self.state, self.state.config
        limit = config.max_queries_per_request
        if config.backend == "web":  # each url may cost a fetch of up to --web_fetch_timeout_s
            limit = min(limit, config.web_fetch_max_urls)
        if len(req.urls) > limit:
            return refuse(labels, 422, "invalid_request", f"{len(req.urls)} urls; the limit is {limit}")
        if state.engine is None:
            return refuse(labels, 503, "not_ready", f"server is {state.status}: {state.detail}")
        try:
            result = await state.engine.pages(req.urls)
        except Exception as e:
            labels["error"] = "internal_error"
            return internal_error("page access", e)
        return json_ok({"result": result})


class ServiceState:
    """Lifecycle of one server: loading → ready (engine + runner) or failed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.status = "loading"
        self.detail = "loading model, index and corpus"
        self.engine: RetrievalEngine | None = None
        self.runner: Batcher | PerRequestRunner | DocumentRunner | None = None
        #: CUDA ordinals of the GPUs the loaded engine uses (GET /health ``gpus``)
        self.gpus: list[int] = []
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
        ready = self.status == "ready" and runner is not None and runner.running
        return ready and self.watchdog.current_problem() is None

    def set_ready(self, engine: RetrievalEngine) -> None:
        c = self.config
        if engine.corpus is None:  # a document backend (web): each request awaits its own live calls
            self.runner = DocumentRunner(engine, max_queue=c.max_queue, metrics=self.metrics)
        elif c.batching:
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
            threads = c.unbatched_threads or (1 if engine.encodes_on_gpu else 40)
            self.runner = PerRequestRunner(engine.search, threads=threads, max_queue=c.max_queue, metrics=self.metrics)
            logger.info("per-request mode: %d thread%s", threads, "" if threads == 1 else "s")
        self.runner.start()
        self.metrics.engine = engine
        self.gpus = engine.gpus()
        self.engine = engine
        self.status, self.detail = "ready", engine.describe()


def health_report(state: ServiceState) -> dict:
    """The body of GET /health (its status code: 200 when ``state.healthy``, else 503)."""
    detail = state.engine.describe() if state.status == "ready" and state.engine is not None else state.detail
    body = {"status": state.status, "detail": detail}  # described when asked: the web backend's counts move
    if state.status == "ready" and not state.healthy:
        problem = state.watchdog.current_problem() or "the batching worker is not running"
        body = {"status": "stuck", "detail": f"{problem}; restart the server if this lasts"}
    if state.engine is not None:
        body["passages"] = state.engine.passages
        body["batching"] = state.config.batching
        body["pages"] = len(state.engine.page_file) if state.engine.page_file is not None else None
        body["gpus"] = gpu_report(state.gpus)
    return body


def create_app(
    config: ServerConfig,
    *,
    engine: RetrievalEngine | None = None,
    loader: Callable[[], RetrievalEngine] | None = None,
    on_load_failed: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """The service, from a loaded ``engine`` or a ``loader`` run in a thread at start-up (/health says 'loading',
    then 'failed' and ``on_load_failed`` if it raises); ``on_ready`` once it answers queries."""
    if (engine is None) == (loader is None):
        raise ValueError("create_app needs exactly one of engine= or loader=")
    state = ServiceState(config)

    def ready(loaded: RetrievalEngine) -> None:
        state.set_ready(loaded)
        if on_ready is not None:
            on_ready()

    async def load() -> None:
        try:
            loaded = await _on_daemon_thread(loader)
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
        if state.engine is not None:
            await asyncio.to_thread(state.engine.close)
        await state.watchdog.stop()

    app = RetrieverApp(
        title="verl-search local retriever",
        version="0.1.0",
        lifespan=lifespan,
        description="Search-R1 compatible retrieval service with cross-request dynamic batching.",
    )
    app.state.service = state
    endpoint, pages = RetrieveEndpoint(state), AccessEndpoint(state)
    app.guard = GuardPostBodies(app.fastapi_stack, state, lanes={"/retrieve": endpoint.serve, "/access": pages.serve})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return invalid_body_response(list(exc.errors()), request.scope.setdefault("state", {}))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail), request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(f"{request.method} {request.url.path}", exc, request)

    @app.post("/retrieve", response_model=RetrieveResponse, responses=_ERRORS)
    async def retrieve(req: RetrieveBody, request: Request) -> Response:
        """Top-k passages per query, in Search-R1's wire format. With return_scores each hit is {document, score}.
        ``{"queries": []}`` answers ``{"result": []}``; SkyRL's ``{"query": str}`` answers one list of hits."""
        # declares the endpoint for /docs: requests are answered by its lane, in front of FastAPI
        return await endpoint.respond(req, request.scope.setdefault("state", {}))

    @app.post("/access", responses=_ERRORS)
    async def access(req: AccessBody, request: Request) -> Response:
        """ASearcher's page access: ``{"result": [page or null per url]}``, from ``--pages_path``, else the corpus
        (``--backend web``: the web cache, else a live fetch)."""
        return await pages.respond(req, request.scope.setdefault("state", {}))

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 once model, index and corpus are loaded and nothing is stuck, else 503; once loaded, ``gpus`` lists the
        memory the server holds on each GPU it uses."""
        return JSONResponse(health_report(state), status_code=200 if state.healthy else 503)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        """Requests, statuses, queue depth, batch sizes, latency percentiles (ms), CPU seconds per stage, memory."""
        return JSONResponse(state.metrics.snapshot())

    return app


async def _on_daemon_thread(fn: Callable[[], RetrievalEngine]) -> RetrievalEngine:
    """``fn()`` on a daemon thread of its own: a server stopped mid-load exits without waiting for it (the default
    executor's threads are joined when the loop closes)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[RetrievalEngine] = loop.create_future()

    def settle(result, error) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = fn()
        except Exception as e:
            error = e
        except BaseException as e:  # SystemExit and the like: the load failed all the same
            error = RuntimeError(f"the load ended with {type(e).__name__}")
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: the server stopped before the load ended
            pass

    threading.Thread(target=run, name="retriever-load", daemon=True).start()
    return await done
