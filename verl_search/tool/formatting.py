"""Passages → the plain text the model reads, in Search-R1's format (``Doc 1(Title: "T") text``), length-capped;
with ``show_urls`` each hit that has a url says it (``Doc 1(Title: "T")(URL: u) text``) so the model can open it.

Invariant: the output is never JSON, always names each query when there are several, and never exceeds max_chars.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_search.protocol import Document

TRUNCATED = " ...(truncated)"


def split_title(doc: Document) -> tuple[str, str]:
    """wiki-18 ``contents`` is ``"Title"\\ntext``; a ``title`` field wins, and a first line repeating it is dropped."""
    extra = doc.model_extra or {}
    title = extra.get("title")
    if isinstance(title, str) and title.strip():
        title = title.strip()
        head, sep, rest = doc.contents.partition("\n")
        if sep and head.strip().strip('"').strip() == title.strip('"'):
            return title, rest
        return title, doc.contents
    head, sep, rest = doc.contents.partition("\n")
    if not sep:
        return "", head
    return head, rest


def url_of(doc: Document) -> str:
    """The hit's url as one line (empty when it has none)."""
    url = (doc.model_extra or {}).get("url")
    return " ".join(url.split()) if isinstance(url, str) else ""


def format_passages(docs: Sequence[Document], *, show_urls: bool = False) -> str:
    """One query's hits as ``Doc i(Title: T) text`` lines (``Doc i(Title: T)(URL: u) text`` with ``show_urls``)."""
    if not docs:
        return "No documents found."
    lines = []
    for i, doc in enumerate(docs, start=1):
        title, text = split_title(doc)
        url = url_of(doc) if show_urls else ""
        where = f"(URL: {url})" if url else ""
        lines.append(f"Doc {i}(Title: {title}){where} {text.strip().replace(chr(10), ' ')}")
    return "\n".join(lines)


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(TRUNCATED))].rstrip() + TRUNCATED


def format_results(
    queries: Sequence[str],
    hits: Sequence[Sequence[Document]],
    *,
    max_chars: int,
    notes: Sequence[str] = (),
    show_urls: bool = False,
) -> str:
    """All queries' results in one text; each block gets an equal share of ``max_chars``."""
    header = f"[note: {'; '.join(notes)}]\n" if notes else ""
    budget = max(0, max_chars - len(header))
    if len(queries) == 1:
        return header + _cap(format_passages(hits[0], show_urls=show_urls), budget)
    share = budget // len(queries)
    blocks = []
    for i, (query, docs) in enumerate(zip(queries, hits, strict=True), start=1):
        label = f'Results for query {i} "{query}":\n'
        blocks.append(_cap(label + format_passages(docs, show_urls=show_urls), max(0, share - 2)))
    return _cap(header + "\n\n".join(blocks), max_chars)
