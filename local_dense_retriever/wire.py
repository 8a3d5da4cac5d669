"""The service's answers as wire bytes: a 200 JSON payload, or an ``ErrorResponse``. Invariant: ``error_answer`` is the
one place a raised error becomes what a client reads: a ``RequestError``'s status, kind and message; anything else a
500 naming only an error id (the cause, which may hold paths or corpus text, goes to the log)."""

from __future__ import annotations

import json
import logging
import uuid

from starlette.responses import JSONResponse, Response

from local_dense_retriever.errors import RequestError
from verl_search.protocol import ErrorResponse

logger = logging.getLogger(__name__)


def json_ok(payload: dict) -> Response:
    """A 200 JSON answer, rendered as Starlette's JSONResponse renders it (same bytes)."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return Response(body, media_type="application/json")


def error_response(status: int, kind: str, detail: str) -> JSONResponse:
    """An ErrorResponse body; 429 and 503 say when to retry."""
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(ErrorResponse(error=kind, detail=detail).model_dump(), status_code=status, headers=headers)


def internal_error(what: str, exc: BaseException) -> JSONResponse:
    """A 500 whose body names only an error id; the cause goes to the log."""
    error_id = uuid.uuid4().hex[:12]
    logger.error("%s failed (error id %s)", what, error_id, exc_info=(type(exc), exc, exc.__traceback__))
    return error_response(500, "internal_error", f"internal server error (error id {error_id}; see the server log)")


def error_answer(exc: Exception, what: str) -> JSONResponse:
    """The answer to a request whose handling (``what``) raised ``exc``."""
    if not isinstance(exc, RequestError):
        return internal_error(what, exc)
    response = error_response(exc.status, exc.kind, str(exc))
    if exc.close:
        response.headers["Connection"] = "close"
    return response


def error_kind(exc: Exception) -> str:
    """The /metrics label of a request whose handling raised ``exc``."""
    return exc.kind if isinstance(exc, RequestError) else "internal_error"
