"""POST /retrieve: ``RetrieveBody`` and ``retrieve_handler``, the handler every search goes through (served by
``middleware.GuardPostBodies``, documented from its signature). Invariant: a request out of the server's limits is
refused with ``InvalidRequest`` before any work; its queries are counted in the metrics once it parses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import InvalidRequest, NotReady
from local_dense_retriever.service_state import ServiceState


class RetrieveBody(BaseModel):
    """Body of ``POST /retrieve``: Search-R1's ``{"queries": [...]}``, or SkyRL's single ``{"query": "..."}``."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] | None = Field(default=None, description="One search string per query (may be empty).")
    query: str | None = Field(default=None, description="A single query (SkyRL); answered as a one-query request.")
    topk: StrictInt | None = Field(default=None, description="Passages per query; null takes the server default.")
    return_scores: bool = Field(default=False, description="Wrap each document as {document, score}.")


def check_limits(req: RetrieveBody, config: ServerConfig) -> None:
    """Raise InvalidRequest naming why ``req`` is out of the server's limits."""
    if (req.queries is None) == (req.query is None):
        raise InvalidRequest("send either 'queries' (a list of strings) or 'query' (one string)")
    queries = req.queries if req.queries is not None else [req.query]
    if len(queries) > config.max_queries_per_request:
        raise InvalidRequest(f"{len(queries)} queries in one request; the limit is {config.max_queries_per_request}")
    for i, q in enumerate(queries):
        if len(q) > config.max_query_chars:
            raise InvalidRequest(f"query {i} has {len(q)} characters; the limit is {config.max_query_chars}")
        try:  # a lone UTF-16 surrogate is legal in JSON, not text
            q.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRequest(
                f"query {i} holds a lone UTF-16 surrogate ({q[e.start]!a} at character {e.start}); send valid Unicode"
            ) from None
    if req.topk is not None and not 1 <= req.topk <= config.max_topk:
        raise InvalidRequest(f"topk must be between 1 and {config.max_topk}, got {req.topk}")


def retrieve_handler(state: ServiceState) -> Callable[[RetrieveBody], Awaitable[dict]]:
    """The handler of POST /retrieve for the server of ``state``."""
    config = state.config

    async def retrieve(req: RetrieveBody) -> dict:
        """Top-k passages per query, in Search-R1's wire format. With return_scores each hit is {document, score}.
        ``{"queries": []}`` answers ``{"result": []}``; SkyRL's ``{"query": str}`` answers one list of hits."""
        queries = req.queries if req.queries is not None else [req.query] if req.query is not None else []
        state.metrics.observe_queries(len(queries))
        check_limits(req, config)
        if not queries:
            return {"result": []}
        if state.runner is None:
            raise NotReady(f"server is {state.status}: {state.detail}")
        hits = await state.runner.submit(queries, req.topk or config.topk)
        if req.return_scores:
            return {"result": [[{"document": doc, "score": score} for doc, score in per_query] for per_query in hits]}
        return {"result": [[doc for doc, _ in per_query] for per_query in hits]}

    return retrieve
