"""ASGI middleware of the POST endpoints: body size limit (413), body read deadline (408), dropping the work of
clients that disconnect, /metrics accounting; and uvicorn's protocol with JSON 400s and a header deadline (408).
Invariants: a body is read in full before the app runs, within ``body_timeout_s``; when the client goes away before
its answer is sent, the app's handling of that request is cancelled (its queued queries are dropped, never computed);
every /retrieve call is counted once in the metrics."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse

from verl_search.protocol import ErrorResponse

logger = logging.getLogger(__name__)

#: status recorded in the metrics for a request whose client disconnected before its answer (nginx's convention)
CLIENT_CLOSED = 499


def error_response(status: int, error: str, detail: str, request=None) -> JSONResponse:
    """An ErrorResponse body; also labels the request for /metrics."""
    if request is not None:
        request.state.error = error
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(ErrorResponse(error=error, detail=detail).model_dump(), status_code=status, headers=headers)


def internal_error(what: str, exc: BaseException, request=None) -> JSONResponse:
    """A 500 whose body names only an error id; the cause (which may hold paths or corpus text) goes to the log."""
    error_id = uuid.uuid4().hex[:12]
    logger.error("%s failed (error id %s)", what, error_id, exc_info=(type(exc), exc, exc.__traceback__))
    return error_response(500, "internal_error", f"internal server error (error id {error_id}; see the server log)",
                          request)  # fmt: skip


async def read_body(receive, limit: int, timeout: float) -> tuple[bytes | None, str | None]:
    """A request's whole body: (body, None), or (None, 'too_large' | 'timeout' | 'disconnected')."""
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return None, "timeout"
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return None, "timeout"
        if message["type"] == "http.disconnect":
            return None, "disconnected"
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, "too_large"
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), None


def body_problem(problem: str, limit: int, timeout: float) -> tuple[int, str, str]:
    """(status, error kind, detail) of the answer to a body ``read_body`` refused as too large or too slow."""
    return {
        "too_large": (413, "body_too_large", f"request body exceeds {limit} bytes"),
        "timeout": (408, "body_timeout", f"request body not received within {timeout:g} s"),
    }[problem]


#: a POST endpoint served straight from its read body: ``lane(scope, body, send)`` (local_dense_retriever.retrieve)
Lane = Callable[[dict, bytes, Callable[[dict], Awaitable[None]]], Awaitable[None]]


class GuardPostBodies:
    """Wraps the app: a POST request to a path of ``lanes`` is read, then answered by that lane, not the app."""

    def __init__(self, app, state, lanes: dict[str, Lane]) -> None:
        self.app, self.state, self.lanes = app, state, lanes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.lanes or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        config = self.state.config
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        status = 500
        started = False

        async def send_status(message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > config.max_body_bytes:
            body, problem = None, "too_large"
        else:
            body, problem = await read_body(receive, config.max_body_bytes, config.body_timeout_s)
        try:
            if problem == "disconnected":
                status = CLIENT_CLOSED
                return
            if problem is not None:
                status_code, kind, detail = body_problem(problem, config.max_body_bytes, config.body_timeout_s)
                scope["state"]["error"] = kind
                response = error_response(status_code, kind, detail)
                if problem == "timeout":
                    response.headers["Connection"] = "close"
                await response(scope, receive, send_status)
                return
            await until_disconnect(self.lanes[scope["path"]](scope, body, send_status), receive)
            if not started:
                status = CLIENT_CLOSED
        finally:
            if scope["path"] == "/retrieve":
                st = scope["state"]
                error = st.get("error") or ("client_disconnected" if status == CLIENT_CLOSED else None)
                self.state.metrics.observe_request(status, time.perf_counter() - t0, st.get("n_queries", 0), error)


async def until_disconnect(work: Awaitable[Any], receive) -> Any:
    """``work``'s result, or None when the client disconnects first (``work`` then cancelled and unwound); ``receive``
    has had the body read. ``work`` runs in the calling task, with one watcher task beside it."""
    me = asyncio.current_task()
    assert me is not None, "until_disconnect runs inside a task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        me.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:  # the caller's own cancellation (server shutdown): not ours to swallow
            raise
        if hasattr(me, "uncancel"):  # Python 3.11+: withdraw the cancel request this function made
            me.uncancel()
        return None
    finally:
        watcher.cancel()
        if watcher.done() and not watcher.cancelled():
            watcher.exception()  # a failed receive: retrieved here, so asyncio does not warn about it


def _raw_json(status: int, reason: str, error: str, detail: str) -> bytes:
    data = ErrorResponse(error=error, detail=detail).model_dump_json().encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + data


def json_400_protocol(header_timeout_s: float | None = None) -> type:
    """uvicorn's HTTP protocol, with a JSON 400 for unparsable requests and a JSON 408 for slow headers."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JSON400Protocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def send_400_response(self, msg: str) -> None:
            self.transport.write(_raw_json(400, "Bad Request", "bad_request", f"malformed HTTP request: {msg}"))
            self.transport.close()

        def connection_made(self, transport, *args, **kwargs) -> None:  # type: ignore[override]
            super().connection_made(transport, *args, **kwargs)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._disarm()
            else:  # part of a request line or headers: the clock runs until they are complete
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm(self) -> None:
            if header_timeout_s is not None and self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self._in_request():
                return
            detail = f"request headers not received within {header_timeout_s:g} s"
            self.transport.write(_raw_json(408, "Request Timeout", "header_timeout", detail))
            self.transport.close()

    return JSON400Protocol
