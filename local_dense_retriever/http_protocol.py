"""uvicorn's HTTP protocol with JSON answers of its own: a 400 for an unparsable request, a 408 for request headers
that do not arrive within the header deadline. Invariant: every byte uvicorn would write as plain text is an
``ErrorResponse`` JSON body here, and the connection is closed after it."""

from __future__ import annotations

import asyncio

from verl_search.protocol import ErrorResponse


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
