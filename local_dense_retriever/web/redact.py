"""Redactor: takes a secret out of text in every encoding a provider may echo it in (raw, percent-encoded in either
case, a ``+`` read back as a space, JSON ``\\uXXXX`` and ``\\/`` escapes, any mix of these per character), before the
text is cut. Invariant: ``clean`` never returns the secret in any of those encodings, nor a piece of it at least
``MIN_FRAGMENT`` characters long that begins or ends it (what a provider's own cut of its echo leaves)."""

from __future__ import annotations

import re

#: shortest head or tail of the secret that is masked on its own
MIN_FRAGMENT = 6
MASK = "***"


def _char(c: str) -> str:
    """A pattern for one character of the secret in any of its encodings."""
    forms = {re.escape(c)}
    if ord(c) < 0x80:
        hex2 = f"{ord(c):02x}"
        forms |= {f"%(?i:{hex2})", rf"\\u(?i:00{hex2})"}
    if c == "/":
        forms.add(r"\\/")
    if c == "+":
        forms.add(" ")
    return "(?:" + "|".join(sorted(forms)) + ")"


class Redactor:
    """``clean(text, limit)``: ``text`` with ``secret`` masked, then cut to ``limit`` characters."""

    def __init__(self, secret: str) -> None:
        chars = [_char(c) for c in secret]
        self._whole = re.compile("".join(chars)) if chars else None
        pieces = []
        for n in range(len(chars) - 1, MIN_FRAGMENT - 1, -1):  # longest first: the alternation takes the first match
            pieces += ["".join(chars[:n]), "".join(chars[-n:])]
        self._pieces = re.compile("|".join(pieces)) if pieces else None
        self._span = 6 * len(secret) + 1  # the longest encoding of the secret (``\u00XX`` per character)

    def clean(self, text: str, limit: int = 200) -> str:
        """The whole secret masked in all of ``text``; then its heads and tails in the part kept, cut to ``limit``."""
        if self._whole is not None:
            text = self._whole.sub(MASK, text)
        if self._pieces is not None:
            # a piece crossing this first cut begins past ``limit``, so the final cut drops it
            text = self._pieces.sub(MASK, text[: limit + self._span])
        return text if len(text) <= limit else text[:limit] + "..."
