"""Turn whatever JSON the model put in a ``search`` call into a clean list of queries, or refuse it.

Invariant: every shape a model can emit either yields 1..max_queries non-empty strings of at most max_query_chars
that UTF-8 can encode (lone UTF-16 surrogates are removed and the model is told), or raises
:class:`InvalidArguments` with a short message naming the expected form (and nothing is sent).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from verl_search.errors import InvalidArguments

EXPECTED = 'call search with {"query_list": ["first query", "second query"]}'
_PREVIEW = 60
_SURROGATE = re.compile("[\ud800-\udfff]")


def describe_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an empty list" if not value else "a list"
    return type(value).__name__


def preview_value(value: Any) -> str:
    """The start of ``value`` as JSON; a value nested too deeply for ``json`` and ``repr`` is named, not shown."""
    try:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    except RecursionError:
        return f"{describe_value(value)} nested too deeply to show"
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "..."


def extract_queries(parameters: Any) -> list[str]:
    """The raw query strings from the call's arguments (``query_list``; a bare string or ``query`` also accepted)."""
    if isinstance(parameters, str):
        raw: Any = [parameters]
    elif isinstance(parameters, list):
        raw = parameters
    elif isinstance(parameters, dict):
        key = next((k for k in ("query_list", "query") if k in parameters), None)
        if key is None:
            keys = ", ".join(sorted(map(str, parameters))) or "none"
            raise InvalidArguments(f"missing 'query_list' (got keys: {keys}); {EXPECTED}")
        raw = [parameters[key]] if isinstance(parameters[key], str) else parameters[key]
    else:
        raise InvalidArguments(f"arguments must be an object, got {describe_value(parameters)}; {EXPECTED}")

    if not isinstance(raw, list):
        raise InvalidArguments(f"'query_list' must be a list of strings, got {describe_value(raw)}; {EXPECTED}")
    if not raw:
        raise InvalidArguments(f"'query_list' is empty; {EXPECTED}")
    for i, item in enumerate(raw, start=1):
        if isinstance(item, (list, dict)):
            raise InvalidArguments(
                f"query {i} is nested ({preview_value(item)}); each query must be a plain string; {EXPECTED}"
            )
        if not isinstance(item, str):
            raise InvalidArguments(f"query {i} is {describe_value(item)}, not a string; {EXPECTED}")
        if not item.strip():
            raise InvalidArguments(f"query {i} is empty; {EXPECTED}")
    return raw


@dataclass
class Queries:
    """Queries ready to send, plus what was changed to make them fit (reported to the model)."""

    queries: list[str]
    notes: list[str] = field(default_factory=list)


def drop_surrogates(query: str) -> tuple[str, int]:
    """``query`` as text UTF-8 can encode (surrogate pairs joined, lone ones removed) and how many were removed."""
    if not _SURROGATE.search(query):
        return query, 0
    query = query.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")  # joins the pairs
    return _SURROGATE.subn("", query)


def normalise_query(query: str) -> str:
    """Whitespace-collapsed query: the form sent to the retriever and the cache key."""
    return " ".join(query.split())


def fit_queries(raw: list[str], *, max_queries: int, max_query_chars: int) -> Queries:
    """Normalise whitespace, cut over-long queries, keep at most ``max_queries``; record each change."""
    out = Queries(queries=[])
    if len(raw) > max_queries:
        out.notes.append(f"only the first {max_queries} of {len(raw)} queries were searched")
        raw = raw[:max_queries]
    for i, query in enumerate(raw, start=1):
        query, removed = drop_surrogates(query)
        query = normalise_query(query)
        if removed:
            if not query:
                raise InvalidArguments(
                    f"query {i} holds only invalid characters (lone UTF-16 surrogates such as \\ud800); "
                    f"write queries as plain text; {EXPECTED}"
                )
            out.notes.append(f"query {i}: {removed} invalid character(s) (lone UTF-16 surrogates) removed")
        if len(query) > max_query_chars:
            out.notes.append(f"query {i} was cut to {max_query_chars} characters")
            query = query[:max_query_chars].rstrip()
        out.queries.append(query)
    return out
