"""One HTTP request run through an ASGI app in this process, without a socket: how a fleet replica serves what the
gateway forwards to it, with the app's own validation, limits, errors and /metrics accounting.

Invariant: the app sees a complete request (the whole body in one message, then nothing until it is cancelled, as a
client that stays connected); the answer comes back whole as ``ForwardedResponse``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class ForwardedRequest:
    """What the gateway read of a client's request."""

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


@dataclass
class ForwardedResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


#: headers about the client's connection to the gateway, not about the request the replica serves
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"expect", b"te", b"upgrade",
                         b"content-length"})  # fmt: skip


async def call_asgi(app, request: ForwardedRequest) -> ForwardedResponse:
    """Run ``request`` through ``app`` (an ASGI 3 callable) and return its whole answer."""
    headers = [(k.lower(), v) for k, v in request.headers if k.lower() not in _HOP_BY_HOP]
    headers.append((b"content-length", str(len(request.body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string,
        "root_path": "",
        "headers": headers,
        "client": ("gateway", 0),
        "server": ("replica", 0),
        "state": {},
    }
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await never.wait()  # the client stays until the request is cancelled
        return {"type": "http.disconnect"}

    status, out_headers, chunks = 500, [], []

    async def send(message: dict) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status, out_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return ForwardedResponse(status, out_headers, b"".join(chunks))
