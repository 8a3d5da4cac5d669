"""Wire models of the retrieval service's ``POST /retrieve``, shared by the server and the client.

The shape is the one every Search-R1 client already speaks; changing it breaks users.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RetrieveRequest(BaseModel):
    """Body of ``POST /retrieve``. ``topk=None`` means the server's default."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(description="One search string per query.")
    topk: int | None = Field(default=None, description="Passages per query; null takes the server default.")
    return_scores: bool = Field(default=False, description="Wrap each document as {document, score}.")


class Document(BaseModel):
    """One corpus row. wiki-18 rows carry ``id`` and ``contents`` (``"Title"\\ntext``); other keys pass through."""

    model_config = ConfigDict(extra="allow")

    id: str
    contents: str


class ScoredDocument(BaseModel):
    """A document with its retrieval score (``return_scores=true``)."""

    model_config = ConfigDict(extra="forbid")

    document: Document
    score: float


class RetrieveResponse(BaseModel):
    """Body of a successful ``POST /retrieve``: one list of hits per query, in query order."""

    model_config = ConfigDict(extra="allow")

    result: list[list[ScoredDocument]] | list[list[Document]]


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer of the retrieval service."""

    error: str = Field(description="Stable machine-readable kind, e.g. 'invalid_request', 'overloaded'.")
    detail: str = Field(description="Human-readable cause.")
