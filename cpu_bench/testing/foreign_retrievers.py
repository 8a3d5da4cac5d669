"""Stand-ins for the retrieval servers of other projects, as ASGI apps to run under uvicorn (``BackgroundServer``).

They answer the way the real ones were recorded answering, so our client and preflight are tested against them:

- ``search_r1_reference_app``: Search-R1's ``retrieval_server.py`` (and verl ≤0.5's copy). Its handler unpacks
  ``results, scores = batch_search(..., return_score=return_scores)``; with ``return_scores: false`` the search returns
  only the results, so two queries give a misshaped 200 (the first query's documents as ``result``) and any other
  count an HTTP 500. With ``return_scores: true`` it answers the scored form.
- ``skyrl_app``: SkyRL's search server: one query per request, ``{"query", "topk", "return_scores"}`` →
  ``{"result": [hits]}``; the batch body is a 422 (FastAPI's validation of the missing ``query``).

``fields="titled"`` serves documents with separate ``title`` and ``url`` fields (``contents`` keeps the wiki-18
``"Title"\\ntext`` form), as ASearcher/RLinf-style corpora carry them. Every request body is recorded in ``.bodies``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from cpu_bench.testing.stub_retriever import StubIndex

Fields = Literal["wiki", "titled"]


class BatchQuery(BaseModel):
    """Search-R1's request model."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class SingleQuery(BaseModel):
    """SkyRL's request model."""

    query: str
    topk: int | None = None
    return_scores: bool = False


class _Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []


def _document(doc: dict, fields: Fields) -> dict:
    if fields == "wiki":
        return dict(doc)
    title = doc["contents"].partition("\n")[0].strip('"')
    return {**doc, "title": title, "url": f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}"}


def search_r1_reference_app(corpus: Sequence[dict] | None = None, *, fields: Fields = "wiki", topk: int = 3) -> FastAPI:
    """Search-R1's reference server: ``POST /retrieve`` in the batch form, broken for ``return_scores: false``."""
    index = StubIndex(corpus)
    app = FastAPI()
    app.state.recorder = recorder = _Recorder()

    def batch_search(queries: list[str], num: int, return_score: bool) -> Any:
        hits = [index.search(q, num) for q in queries]
        results = [[_document(d, fields) for d, _ in per] for per in hits]
        if return_score:
            return results, [[s for _, s in per] for per in hits]
        return results

    @app.post("/retrieve")
    def retrieve(request: BatchQuery) -> Any:
        recorder.bodies.append(request.model_dump())
        try:
            results, scores = batch_search(request.queries, request.topk or topk, request.return_scores)
        except ValueError:  # the reference server's unpacking bug: an unhandled exception, i.e. a bare HTTP 500
            return PlainTextResponse("Internal Server Error", status_code=500)
        resp = []
        for i, single_result in enumerate(results):
            if request.return_scores:
                resp.append(
                    [{"document": doc, "score": score} for doc, score in zip(single_result, scores[i], strict=True)]
                )
            else:
                resp.append(single_result)
        return {"result": resp}

    return app


def skyrl_app(corpus: Sequence[dict] | None = None, *, fields: Fields = "wiki", topk: int = 3) -> FastAPI:
    """SkyRL's search server: ``POST /retrieve`` with one query per request."""
    index = StubIndex(corpus)
    app = FastAPI()
    app.state.recorder = recorder = _Recorder()

    @app.post("/retrieve")
    def retrieve(request: SingleQuery) -> Any:
        recorder.bodies.append(request.model_dump())
        hits = index.search(request.query, request.topk or topk)
        if request.return_scores:
            return {"result": [[{"document": _document(d, fields), "score": s} for d, s in hits]]}
        return {"result": [[_document(d, fields) for d, _ in hits]]}

    return app
