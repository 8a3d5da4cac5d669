"""The POST endpoints as plain ASGI lanes (``JsonLane``), POST /retrieve the one path every search takes: one
``json.loads``, one validation, two ASGI messages, no routing or middleware stack. FastAPI's routes only declare the
endpoints in the OpenAPI schema; both answer through ``respond``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from starlette.responses import Response

from local_dense_retriever.errors import BatcherStopped, Overloaded, QueryFailed, QueryRejected
from local_dense_retriever.middleware import error_response, internal_error

if TYPE_CHECKING:
    from local_dense_retriever.app import ServiceState
    from local_dense_retriever.config import ServerConfig


class RetrieveBody(BaseModel):
    """Body of ``POST /retrieve``: Search-R1's ``{"queries": [...]}``, or SkyRL's single ``{"query": "..."}``."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] | None = Field(default=None, description="One search string per query (may be empty).")
    query: str | None = Field(default=None, description="A single query (SkyRL); answered as a one-query request.")
    topk: StrictInt | None = Field(default=None, description="Passages per query; null takes the server default.")
    return_scores: bool = Field(default=False, description="Wrap each document as {document, score}.")


def request_problem(req: RetrieveBody, config: ServerConfig) -> str | None:
    """The reason ``req`` is out of the server's limits, or None when it is fine."""
    if (req.queries is None) == (req.query is None):
        return "send either 'queries' (a list of strings) or 'query' (one string)"
    queries = req.queries if req.queries is not None else [req.query]
    if len(queries) > config.max_queries_per_request:
        return f"{len(queries)} queries in one request; the limit is {config.max_queries_per_request}"
    for i, q in enumerate(queries):
        if len(q) > config.max_query_chars:
            return f"query {i} has {len(q)} characters; the limit is {config.max_query_chars}"
        try:  # a lone UTF-16 surrogate is legal in JSON, not text
            q.encode("utf-8")
        except UnicodeEncodeError as e:
            return (
                f"query {i} holds a lone UTF-16 surrogate ({q[e.start]!a} at character {e.start}); send valid Unicode"
            )
    if req.topk is not None and not 1 <= req.topk <= config.max_topk:
        return f"topk must be between 1 and {config.max_topk}, got {req.topk}"
    return None


def invalid_body_response(errors: list[dict], labels: dict) -> Response:
    """A 400 for a body that is not JSON, a 422 naming where it is not a RetrieveBody (``queries.1: ...``)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return refuse(labels, 400, "invalid_json", "request body is not valid JSON")
    parts = [f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}" for e in errors]
    return refuse(labels, 422, "invalid_request", "; ".join(parts[:5]))


def refuse(labels: dict, status: int, kind: str, detail: str) -> Response:
    """An ErrorResponse, its kind recorded in the request's ``labels`` (``scope["state"]``, read for /metrics)."""
    labels["error"] = kind
    return error_response(status, kind, detail)


def parse_body(body: bytes, model: type[BaseModel]) -> BaseModel:
    """``body`` as a ``model``, read as FastAPI reads a JSON body; raises ValidationError."""
    if not body:
        raise ValidationError.from_exception_data(
            model.__name__, [{"type": "missing", "loc": ("body",), "input": None}]
        )
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested past the parser's depth
        raise ValidationError.from_exception_data(
            model.__name__, [{"type": "json_invalid", "loc": ("body",), "input": None, "ctx": {"error": str(e)}}]
        ) from None
    return model.model_validate(data, from_attributes=True)  # as FastAPI validates a body (same messages)


class JsonLane:
    """A POST endpoint: ``serve`` answers a read body (``middleware.Lane``); ``respond`` turns one parsed as
    ``model`` into the answer."""

    model: type[BaseModel]

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def respond(self, req, labels: dict) -> Response:
        raise NotImplementedError

    async def serve(self, scope: dict, body: bytes, send) -> None:
        """Answer the request of ``scope`` with ``body`` on ``send``; nothing escapes (an unexpected error is a 500)."""
        labels = scope.setdefault("state", {})
        try:
            try:
                req = parse_body(body, self.model)
            except ValidationError as e:
                response = invalid_body_response(e.errors(include_url=False), labels)
            else:
                response = await self.respond(req, labels)
        except Exception as e:
            labels["error"] = "internal_error"
            response = internal_error(f"{scope['method']} {scope['path']}", e)
        await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


class RetrieveEndpoint(JsonLane):
    """POST /retrieve."""

    model = RetrieveBody

    async def respond(self, req: RetrieveBody, labels: dict) -> Response:
        """The answer to a parsed body (also the FastAPI route's)."""
        state, config = self.state, self.state.config
        queries = req.queries if req.queries is not None else [req.query] if req.query is not None else []
        labels["n_queries"] = len(queries)
        problem = request_problem(req, config)
        if problem is not None:
            return refuse(labels, 422, "invalid_request", problem)
        if not queries:
            return json_ok({"result": []})
        if state.runner is None:
            return refuse(labels, 503, "not_ready", f"server is {state.status}: {state.detail}")
        try:
            hits = await state.runner.submit(queries, req.topk or config.topk)
        except Overloaded as e:
            return refuse(labels, 429, "overloaded", str(e))
        except BatcherStopped as e:
            return refuse(labels, 503, "unavailable", str(e))
        except QueryRejected as e:
            return refuse(labels, 422, "invalid_query", str(e))
        except QueryFailed as e:  # one of its queries failed on its own (budget spent, not cached, provider down)
            return refuse(labels, e.status, e.kind, str(e))
        except Exception as e:  # the engine failed: this batch's callers get a 500, the server stays up
            labels["error"] = "internal_error"
            return internal_error("retrieval", e)
        if req.return_scores:
            result = [[{"document": doc, "score": score} for doc, score in per_query] for per_query in hits]
        else:
            result = [[doc for doc, _ in per_query] for per_query in hits]
        return json_ok({"result": result})


def json_ok(payload: dict) -> Response:
    """A 200 JSON answer, rendered as Starlette's JSONResponse renders it (same bytes)."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return Response(body, media_type="application/json")
