"""The one path of the POST endpoints: ``GuardPostBodies`` serves every POST to a ``PostRoute``'s path in front of
FastAPI's middleware: body size limit (413), body read deadline (408), the body parsed once as the handler's model,
the handler's work dropped when its client disconnects, /metrics accounting. FastAPI documents each ``PostRoute``
(``/docs``) from its handler's signature, and its router hands such a request to the same path.
Invariants: a body is read in full before the handler runs, within ``body_timeout_s``; when the client goes away
before its answer is sent, the handler is cancelled (its queued queries are dropped, never computed); every request
to a metered path is counted once in the metrics, labelled with its error's kind."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import BodyTimeout, BodyTooLarge, ClientDisconnected, InvalidJson, InvalidRequest
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.wire import error_answer, error_kind, json_ok


async def read_body(receive, limit: int, timeout: float, declared: bytes | None = None) -> bytes:
    """A request's whole body (its ``declared`` content-length checked first); raises BodyTooLarge, BodyTimeout or
    ClientDisconnected."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    late = f"request body not received within {timeout:g} s"
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise BodyTimeout(late)
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            raise BodyTimeout(late) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("the client disconnected while sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_body(body: bytes, model: type[BaseModel]) -> BaseModel:
    """``body`` as a ``model``, validated as FastAPI validates a JSON body; raises InvalidJson or InvalidRequest
    (naming where it is not a ``model``: ``queries.1: ...``)."""
    if not body:
        raise InvalidRequest("body: Field required")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        raise InvalidJson("request body is not valid JSON") from None
    try:
        return model.model_validate(data, from_attributes=True)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        parts = [f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in errors]
        raise InvalidRequest("; ".join(parts[:5])) from None


class PostRoute(APIRoute):
    """A POST endpoint: ``handler(body: Model) -> payload dict``, raising a RequestError to refuse. FastAPI builds its
    /docs entry from the handler's signature; ``GuardPostBodies`` serves it."""

    def __init__(self, path: str, endpoint: Callable[..., Awaitable[dict]], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        hints = typing.get_type_hints(endpoint)
        (self.body_model,) = (t for name, t in hints.items() if name != "return")

    async def answer(self, body: bytes) -> dict:
        """The payload answering ``body``."""
        return await self.endpoint(parse_body(body, self.body_model))


class GuardPostBodies:
    """Wraps the app: a POST to the path of one of ``routes`` is served by ``serve``, not by the app (whose router
    also hands those routes' requests to ``serve``); requests to a path of ``metered`` are counted in ``metrics``."""

    def __init__(
        self, app, config: ServerConfig, metrics: Metrics, routes: Iterable[PostRoute], metered: Iterable[str]
    ) -> None:
        self.app, self.config, self.metrics = app, config, metrics
        self.routes = {route.path: route for route in routes}
        self.metered = frozenset(metered)
        for route in self.routes.values():
            route.app = functools.partial(self.serve, route)

    async def __call__(self, scope, receive, send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
        else:
            await self.serve(route, scope, receive, send)

    async def serve(self, route: PostRoute, scope, receive, send) -> None:
        """Answer one request to ``route``; nothing escapes (an unexpected error is a 500)."""
        config = self.config
        t0 = time.perf_counter()
        status, kind = ClientDisconnected.status, None
        try:
            try:
                declared = dict(scope["headers"]).get(b"content-length")
                body = await read_body(receive, config.max_body_bytes, config.body_timeout_s, declared)
                response = json_ok(await until_disconnect(route.answer(body), receive))
            except ClientDisconnected:
                kind = ClientDisconnected.kind
                return
            except Exception as e:
                kind = error_kind(e)
                response = error_answer(e, f"{scope['method']} {scope['path']}")
            status = response.status_code
            await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
            await send({"type": "http.response.body", "body": response.body})
        finally:
            if route.path in self.metered:
                self.metrics.observe_request(status, time.perf_counter() - t0, kind)


async def until_disconnect(work: Awaitable[Any], receive) -> Any:
    """``work``'s result; raises ClientDisconnected when the client disconnects first (``work`` then cancelled and
    unwound); ``receive`` has had the body read. ``work`` runs in the calling task, with one watcher task beside it."""
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
        raise ClientDisconnected("the client disconnected before its answer") from None
    finally:
        watcher.cancel()
        if watcher.done() and not watcher.cancelled():
            watcher.exception()  # a failed receive: retrieved here, so asyncio does not warn about it
