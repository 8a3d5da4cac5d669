"""A page's text as numbered windows the model reads one call at a time: ``[page 2 of 7] Title`` then the window's
text, then, while windows remain, the exact call that reads the next one (in the form of the model's protocol,
``tool.access_forms``).

Invariants: every rendered window, header and hint included, fits ``max_chars``; a window is cut at a paragraph break,
else a line break, else whitespace in its second half, and only without any of those mid-word; the same page and
``max_chars`` always give the same windows (so page numbers stay valid between calls).
"""

from __future__ import annotations

import re

from verl_search.tool.access_forms import TOOL_CALL, AccessForm
from verl_search.tool.wire import Page

#: characters of the title shown in a window's header
TITLE_CHARS = 120
EMPTY = "(this page has no text)"
_SPACE = re.compile(r"\s")


def header(number: int, total: int, title: str) -> str:
    return f"[page {number} of {total}] {title}".rstrip() + "\n"


def next_hint(url: str, number: int, total: int, form: AccessForm = TOOL_CALL) -> str:
    """What follows a window that is not the last: how to read the next one, written in ``form``."""
    return f"\n[{total - number} more window(s); read the next with {form.call(url, number + 1)}]"


def short_title(page: Page) -> str:
    title = " ".join(page.title.split())
    return title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 3].rstrip() + "..."


def cut(text: str, size: int) -> list[str]:
    """``text`` in consecutive stripped, non-empty pieces of at most ``size`` characters (see the module's rule)."""
    pieces = []
    rest = text.strip()
    while rest:
        if len(rest) <= size:
            pieces.append(rest)
            break
        head = rest[: size + 1]  # a break right after the window's last character still counts
        at = -1
        for sep in ("\n\n", "\n"):
            found = head.rfind(sep)
            if found >= size // 2:
                at = found
                break
        if at < 0:
            spaces = [m.start() for m in _SPACE.finditer(head, size // 2)]
            at = spaces[-1] if spaces else size
        piece = rest[:at].rstrip()
        pieces.append(piece)
        rest = rest[at:].lstrip()
    return pieces


def windows(page: Page, url: str, max_chars: int, form: AccessForm = TOOL_CALL) -> list[str]:
    """The page's windows as the model reads them, first to last; ``url`` is the one the model asked for (the hint
    repeats it in ``form``, so the next call finds the cached page)."""
    title = short_title(page)
    digits = 1
    while True:  # the header and hint hold the window numbers: reserve their width, widen if the page needs more
        widest = 10**digits - 1
        overhead = len(header(widest, widest, title)) + len(next_hint(url, widest - 1, widest, form))
        size = max(1, max_chars - overhead)
        pieces = cut(page.contents, size) or [EMPTY]
        if len(pieces) <= widest:
            break
        digits += 1
    total = len(pieces)
    return [
        header(n, total, title) + piece + (next_hint(url, n, total, form) if n < total else "")
        for n, piece in enumerate(pieces, start=1)
    ]
