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
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from local_dense_retriever.access import access_handler
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.memory import release_free_memory_every
from local_dense_retriever.middleware import GuardPostBodies, PostRoute
from local_dense_retriever.retrieve import retrieve_handler
from local_dense_retriever.service_state import ServiceState, health_report
from local_dense_retriever.wire import error_response, internal_error
from verl_search.protocol import ErrorResponse, RetrieveResponse

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 408, 413, 422, 429, 500, 502, 503)}


class RetrieverApp(FastAPI):
    """FastAPI with its POST endpoints (``PostRoute``) served by ``guard`` in front of its middleware."""

    guard: GuardPostBodies

    async def __call__(self, scope, receive, send) -> None:
        await self.guard(scope, receive, send)

    async def fastapi_stack(self, scope, receive, send) -> None:
        """FastAPI's handling of a request (what ``guard`` runs for every request it does not take)."""
        await super().__call__(scope, receive, send)


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
    retrieve, access = retrieve_handler(state), access_handler(state)
    post = dict(methods=["POST"], responses=_ERRORS, route_class_override=PostRoute)
    app.router.add_api_route("/retrieve", retrieve, response_model=RetrieveResponse, **post)
    app.router.add_api_route("/access", access, response_model=None, **post)
    routes = [route for route in app.routes if isinstance(route, PostRoute)]
    app.guard = GuardPostBodies(app.fastapi_stack, config, state.metrics, routes, metered=["/retrieve"])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return internal_error(f"{request.method} {request.url.path}", exc)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 once model, index and corpus are loaded and nothing is stuck, else 503; once loaded, ``gpus`` lists the
        memory the server holds on each GPU it uses."""
        return JSONResponse(health_report(state), status_code=200 if state.healthy else 503)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        """Requests, statuses, queue depth, batch sizes, latency percentiles (ms), CPU seconds per stage, memory."""
        return JSONResponse(state.metrics_report())

    return app


async def _on_daemon_thread(fn: Callable[[], RetrievalEngine]) -> RetrievalEngine:
    """``fn()`` on a daemon thread of its own: a server stopped mid-load exits without waiting for it (the default
    executor's threads are joined when the loop closes)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[RetrievalEngine] = loop.create_future()

    def settle(finish: Callable[[], None]) -> None:
        if not done.done():  # the awaiting task may have been cancelled (server stopped mid-load)
            finish()

    def run() -> None:
        try:
            result = fn()
        except Exception as e:
            finish = functools.partial(done.set_exception, e)
        except BaseException as e:  # SystemExit and the like: the load failed all the same
            finish = functools.partial(done.set_exception, RuntimeError(f"the load ended with {type(e).__name__}"))
        else:
            finish = functools.partial(done.set_result, result)
        try:
            loop.call_soon_threadsafe(settle, finish)
        except RuntimeError:  # the loop is closed: the server stopped before the load ended
            pass

    threading.Thread(target=run, name="retriever-load", daemon=True).start()
    return await done
