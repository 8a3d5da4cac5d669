"""A fetched page's bytes as text: decoded by its declared charset (else UTF-8, bad bytes replaced), and for HTML its
title and readable text (stdlib ``html.parser``). Invariant: never raises on any input; script, style, noscript,
template and head content never reach the text."""

from __future__ import annotations

import re
from collections import Counter
from html.parser import HTMLParser

#: elements whose content is never text a reader sees (``head`` keeps its ``title``)
HIDDEN = frozenset({"script", "style", "noscript", "template", "head"})
#: elements that start a new line of text
BLOCKS = frozenset(
    "address article aside blockquote br dd div dl dt fieldset figcaption figure footer form h1 h2 h3 h4 h5 h6 "
    "header hr li main nav ol p pre section table tbody td th thead tr ul".split()
)
#: a charset declared in the first bytes of an HTML document (``<meta charset=...>`` or ``http-equiv``)
_META_CHARSET = re.compile(rb"<meta[^>]{0,200}?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]{1,40})", re.IGNORECASE)
_ANY_SPACE = re.compile(r"\s+")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\s*\n\s*")


def decode(body: bytes, charset: str | None, *, html: bool) -> str:
    """``body`` as text: a UTF-8 BOM wins, then ``charset`` (the HTTP header's), then for HTML a ``<meta>`` charset in
    the first 1024 bytes, then UTF-8; an unknown or non-text codec falls through to the next; bad bytes are replaced."""
    if body.startswith(b"\xef\xbb\xbf"):
        return body[3:].decode("utf-8", errors="replace")
    declared = [charset] if charset else []
    if html and (m := _META_CHARSET.search(body[:1024])):
        declared.append(m.group(1).decode("ascii"))
    for name in declared:
        try:
            return body.decode(name, errors="replace")
        except LookupError:  # unknown name, or a codec that is not a text encoding (base64, rot13, ...)
            continue
    return body.decode("utf-8", errors="replace")


def collapse(text: str) -> str:
    """Runs of spaces and tabs as one space, blank lines dropped, each line stripped."""
    return _BLANK_LINES.sub("\n", _SPACES.sub(" ", text)).strip()


class _Extractor(HTMLParser):
    """Collects the title and the visible text; ``open`` counts the hiding elements open now, per tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self.open = Counter()
        self.in_title = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "title":
            self.in_title = True
        elif tag == "body":  # an unclosed head ends where the body starts
            self.open["head"] = 0
        elif tag in HIDDEN and not (tag == "head" and self.open["head"]):
            self.open[tag] += 1
        if tag in BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag in HIDDEN and self.open[tag] > 0:
            self.open[tag] -= 1
        if tag in BLOCKS:
            self.parts.append("\n")

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        if tag in BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
        elif not any(self.open.values()):
            self.parts.append(_ANY_SPACE.sub(" ", data))  # in HTML a newline is a space; blocks make the lines


def html_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document: whitespace collapsed, block elements on their own lines."""
    parser = _Extractor()
    parser.feed(html)
    parser.close()
    return collapse(" ".join(parser.title)).replace("\n", " "), collapse("".join(parser.parts))
