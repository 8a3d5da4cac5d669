"""Turn whatever JSON the model put in an ``access`` call into one url and a window number, or refuse it.

Invariant: every shape a model can emit either yields a non-empty url of at most MAX_URL_CHARS characters without
whitespace or lone UTF-16 surrogates and a page >= 1, or raises :class:`InvalidArguments` with a short message naming
the expected form of the model's protocol (and nothing is sent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from verl_search.errors import InvalidArguments
from verl_search.tool.access_forms import TOOL_CALL
from verl_search.tool.arguments import describe_value, drop_surrogates, preview_value

EXPECTED = TOOL_CALL.expected
#: the longest url accepted (a window's hint repeats it, inside the window's character cap)
MAX_URL_CHARS = 400


@dataclass(frozen=True)
class AccessRequest:
    url: str
    page: int


def parse_access(parameters: Any, expected: str = EXPECTED) -> AccessRequest:
    """The url (stripped) and 1-based window number of an ``access`` call; a string holding a JSON object is read as
    that object, any other string as the url; ``expected`` is what the messages tell the model to write."""
    if isinstance(parameters, str) and parameters.strip().startswith("{"):
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError as e:
            raise InvalidArguments(f"the arguments are not valid JSON ({e.msg}); {expected}") from e
    if isinstance(parameters, str):
        parameters = {"url": parameters}
    if not isinstance(parameters, dict):
        raise InvalidArguments(f"arguments must be an object, got {describe_value(parameters)}; {expected}")
    if "url" not in parameters:
        keys = ", ".join(sorted(map(str, parameters))) or "none"
        raise InvalidArguments(f"missing 'url' (got keys: {keys}); {expected}")
    url = parameters["url"]
    if not isinstance(url, str):
        raise InvalidArguments(f"'url' must be a string, got {describe_value(url)}; {expected}")
    url = url.strip()
    if not url:
        raise InvalidArguments(f"'url' is empty; {expected}")
    if len(url) > MAX_URL_CHARS:
        raise InvalidArguments(f"'url' is {len(url)} characters long, more than {MAX_URL_CHARS}; {expected}")
    if drop_surrogates(url)[1] or any(ch.isspace() for ch in url):
        raise InvalidArguments(f"'url' must be one url without spaces or invalid characters; {expected}")
    page = parameters.get("page", 1)
    if page is None:
        page = 1
    if isinstance(page, bool) or not isinstance(page, int):
        raise InvalidArguments(
            f"'page' must be a whole number, got {describe_value(page)} ({preview_value(page)}); {expected}"
        )
    if page < 1:
        raise InvalidArguments(f"'page' must be 1 or more, got {page}; {expected}")
    return AccessRequest(url=url, page=page)
