"""POST /access (ASearcher): ``AccessBody`` and ``access_handler``: per url its page or null (``engine.pages``).
Invariant: no more urls than the server's limit reach the engine (with ``--backend web``, each may cost a fetch)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict

from local_dense_retriever.errors import InvalidRequest, NotReady
from local_dense_retriever.service_state import ServiceState


class AccessBody(BaseModel):
    """Body of ``POST /access`` (ASearcher): the pages of these URLs."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str]


def access_handler(state: ServiceState) -> Callable[[AccessBody], Awaitable[dict]]:
    """The handler of POST /access for the server of ``state``."""
    config = state.config
    limit = config.max_queries_per_request
    if config.backend == "web":  # each url may cost a fetch of up to --web_fetch_timeout_s
        limit = min(limit, config.web_fetch_max_urls)

    async def access(req: AccessBody) -> dict:
        """ASearcher's page access: ``{"result": [page or null per url]}``, from ``--pages_path``, else the corpus
        (``--backend web``: the web cache, else a live fetch)."""
        if len(req.urls) > limit:
            raise InvalidRequest(f"{len(req.urls)} urls; the limit is {limit}")
        if state.engine is None:
            raise NotReady(f"server is {state.status}: {state.detail}")
        return {"result": await state.engine.pages(req.urls)}

    return access
