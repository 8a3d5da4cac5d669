"""The request bodies the tool clients send and the replies they read: /retrieve in both wire forms found in the wild,
``search_r1`` (``{"queries": [...], ...}`` → one hit list per query) and ``skyrl`` (``{"query": q, ...}`` → one), and
ASearcher's /access (``{"urls": [...]}`` → a page or null per url).

Invariant: every body asks for ``return_scores: true`` (the reference servers fail on ``false``), and a hit is
accepted scored or bare; anything else raises :class:`BadResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_search.errors import BadResponse
from verl_search.protocol import Document

#: what the model-facing text and logs call each form
FORM_NAMES: dict[str, str] = {
    "search_r1": "Search-R1 batch form ({queries: [...]})",
    "skyrl": "SkyRL single-query form ({query: str})",
}


def batch_body(queries: Sequence[str], topk: int) -> dict[str, Any]:
    """The ``search_r1`` request body for ``queries``."""
    return {"queries": list(queries), "topk": topk, "return_scores": True}


def single_body(query: str, topk: int) -> dict[str, Any]:
    """The ``skyrl`` request body for one query."""
    return {"query": query, "topk": topk, "return_scores": True}


def parse_document(item: Any) -> Document:
    """One hit, scored or bare; ``contents`` is required, other keys (``title``, ``url``, ...) pass through."""
    raw = item.get("document") if isinstance(item, dict) and isinstance(item.get("document"), dict) else item
    if not isinstance(raw, dict) or not isinstance(raw.get("contents"), str):
        raise BadResponse("a hit has no 'contents' string")
    fields = dict(raw)
    fields["id"] = str(fields.get("id", ""))
    return Document.model_construct(**fields)  # the two required fields were just checked


def _hit_list(per_query: Any) -> list[Document]:
    if not isinstance(per_query, list):
        raise BadResponse("a result entry is not a list")
    return [parse_document(item) for item in per_query]


def parse_hits(body: Any, expected: int) -> list[list[Document]]:
    """A ``search_r1`` reply → one list of documents per query (``expected`` of them)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise BadResponse("reply has no 'result' list")
    result = body["result"]
    if len(result) != expected:
        raise BadResponse(f"reply has {len(result)} result lists for {expected} queries")
    return [_hit_list(per_query) for per_query in result]


def parse_single(body: Any) -> list[Document]:
    """A ``skyrl`` reply → the documents of its one query (a bare list of hits is accepted too)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise BadResponse("reply has no 'result' list")
    result = body["result"]
    if len(result) == 1 and isinstance(result[0], list):
        return _hit_list(result[0])
    if all(isinstance(item, dict) for item in result):
        return _hit_list(result)
    raise BadResponse(f"reply has {len(result)} result lists for 1 query")


@dataclass(frozen=True)
class Page:
    """One page of /access: its text (``contents``), its title ('' when the service gives none) and its url."""

    url: str
    title: str
    contents: str


def access_body(urls: Sequence[str]) -> dict[str, Any]:
    """The /access request body for ``urls``."""
    return {"urls": list(urls)}


def parse_pages(body: Any, urls: Sequence[str]) -> list[Page | None]:
    """An /access reply → per url its :class:`Page`, or None where the service answered null (it has no such page)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise BadResponse("reply has no 'result' list")
    result = body["result"]
    if len(result) != len(urls):
        raise BadResponse(f"reply has {len(result)} pages for {len(urls)} urls")
    pages: list[Page | None] = []
    for url, item in zip(urls, result, strict=True):
        if item is None:
            pages.append(None)
            continue
        if not isinstance(item, dict) or not isinstance(item.get("contents"), str):
            raise BadResponse("a page has no 'contents' string")
        title, own_url = item.get("title"), item.get("url")
        pages.append(
            Page(
                url=own_url if isinstance(own_url, str) and own_url else url,
                title=title.strip() if isinstance(title, str) else "",
                contents=item["contents"],
            )
        )
    return pages


def error_reply(raw: bytes) -> tuple[str | None, str]:
    """A retrieval service's error answer: its ``error`` kind (None unless a JSON object names one) and a detail."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return None, raw[:200].decode("utf-8", "replace") or "no body"
    kind = body.get("error") if isinstance(body.get("error"), str) else None
    return kind, str(body.get("detail") or body.get("error") or body)[:200]
