"""How a model writes an access call in each protocol: ``tool_agent``'s JSON tool call, or ``search_r1_agent``'s
``<access>`` tags. A window's next-window hint and every invalid-arguments message name the form the model uses.

Invariant: ``call(url, page)`` is text that, written by the model in that protocol, reads window ``page`` of ``url``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def _arguments(url: str, page: int) -> str:
    return json.dumps({"url": url, "page": page}, ensure_ascii=False)


@dataclass(frozen=True)
class AccessForm:
    """One protocol's way of writing an access call."""

    tags: bool  # True: ``<access> ... </access>`` (native loop); False: a JSON tool call
    expected: str  # what invalid-arguments messages tell the model to write

    def call(self, url: str, page: int) -> str:
        """The call that reads window ``page`` of ``url``."""
        if self.tags:
            return f"<access> {_arguments(url, page)} </access>"
        return f"access {_arguments(url, page)}"


TOOL_CALL = AccessForm(
    tags=False,
    expected='call access with {"url": "https://...", "page": 1} (page is optional: 1 is the first window)',
)
#: the native loop: a bare url reads window 1; a JSON object with ``url`` and ``page`` reads any window
NATIVE = AccessForm(
    tags=True,
    expected="write <access> https://... </access> for the first window of a page, or "
    '<access> {"url": "https://...", "page": 2} </access> for another window',
)
