"""Request and response adapters of the web search providers (Serper, SerpAPI, Brave), in their documented shapes.
Invariant: the API key travels only in the request built here; no message raised here holds it, a URL, or any text
the provider sent (that is kept apart, as ``ProviderFailure.said``)."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from local_dense_retriever.errors import RetrieverError

#: a documented answer of SerpAPI that means "no results", not a failure
_SERPAPI_EMPTY = "hasn't returned any results"
_TAG = re.compile(r"<[^>]*>")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
#: what one hit may hold; a longer title or snippet is cut, a hit with a longer url skipped
MAX_TITLE_CHARS, MAX_SNIPPET_CHARS, MAX_URL_CHARS = 500, 2000, 2048


@dataclass(frozen=True)
class WebHit:
    """One organic result, in rank order."""

    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class ProviderRequest:
    """What to send: ``method`` to ``url`` with query ``params``, ``headers`` and a JSON body (or None)."""

    method: str
    url: str
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    json: dict | None = None


class ProviderFailure(RetrieverError, RuntimeError):
    """One attempt failed: the provider answered an error or a reply that is not its documented shape, or (``status``
    None) no answer came. ``retryable``: 429, 5xx, timeouts, dropped connections; ``retry_after``: its Retry-After
    seconds; ``sent``: the request may have reached the provider (and been billed). The message is ours (what failed,
    never the provider's text, the key or a URL); ``said`` is the provider's own text, unredacted, for the caller to
    redact before it is logged."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        retryable: bool,
        retry_after: float | None = None,
        sent: bool = True,
        said: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.sent = sent
        self.said = said


def clean(value: str) -> str:
    """``value`` as text SQLite and UTF-8 can hold: a lone surrogate becomes U+FFFD, control characters go."""
    value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return _CONTROL.sub("", value)


def _text(value: Any, limit: int) -> str:
    """A provider's text field as plain text: tags stripped, entities unescaped, cleaned, whitespace collapsed, cut."""
    if not isinstance(value, str):
        return ""
    text = " ".join(clean(html.unescape(_TAG.sub("", value[: 4 * limit]))).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shape(name: str, what: str) -> ProviderFailure:
    return ProviderFailure(f"{name} sent a reply outside its documented shape ({what})", status=200, retryable=False)


def _hits(name: str, items: Any, url_key: str, snippet_key: str, k: int) -> list[WebHit]:
    """The first ``k`` hits of a results list; an item without a usable link is skipped, one that is not an object
    fails the reply."""
    if not isinstance(items, list):
        raise _shape(name, "the results are not a list")
    hits: list[WebHit] = []
    for item in items:
        if len(hits) == k:
            break
        if not isinstance(item, dict):
            raise _shape(name, "a result is not an object")
        url = item.get(url_key)
        if isinstance(url, str) and url and len(url) <= MAX_URL_CHARS:
            hits.append(WebHit(_text(item.get("title"), MAX_TITLE_CHARS), clean(url),
                               _text(item.get(snippet_key), MAX_SNIPPET_CHARS)))  # fmt: skip
    return hits


class Provider:
    """One provider: how to ask for the top ``k`` of a query and how to read the answer."""

    name = ""
    default_url = ""
    key_env = ""
    max_k = 100

    def request(self, base_url: str, query: str, k: int, key: str) -> ProviderRequest:
        raise NotImplementedError

    def results(self, body: dict, k: int) -> list[WebHit]:
        """The first ``k`` hits of a 200 answer's JSON object; ``ProviderFailure`` when it is not the documented
        shape (only the provider's documented 'no results' answer is an empty list)."""
        raise NotImplementedError

    def error_message(self, body: Any) -> str | None:
        """The provider's own error text in ``body``, if it holds one."""
        raise NotImplementedError

    def parse(self, status: int, raw: bytes, k: int, retry_after: float | None = None) -> list[WebHit]:
        """The first ``k`` hits of an answer, or ``ProviderFailure``: a non-200 status, an error body, a reply that is
        not JSON (nested past the parser's depth included) or not the documented shape."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = None
        if status != 200:
            retryable = status == 429 or status >= 500
            raise ProviderFailure(f"{self.name} answered an error status", status=status, retryable=retryable,
                                  retry_after=retry_after, said=self.error_message(body) or "")  # fmt: skip
        if not isinstance(body, dict):
            raise ProviderFailure(f"{self.name} sent a reply that is not a JSON object", status=200, retryable=False)
        return self.results(body, min(k, self.max_k))


class Serper(Provider):
    """google.serper.dev: POST JSON {q, num} with the key in X-API-KEY; hits under ``organic`` (an empty list: no
    results); a 200 holding only ``message`` is an error."""

    name, default_url, key_env = "serper", "https://google.serper.dev/search", "SERPER_API_KEY"

    def request(self, base_url: str, query: str, k: int, key: str) -> ProviderRequest:
        headers = {"X-API-KEY": key, "Content-Type": "application/json"}
        return ProviderRequest("POST", base_url, headers=headers, json={"q": query, "num": min(k, self.max_k)})

    def results(self, body: dict, k: int) -> list[WebHit]:
        if "organic" not in body and body.get("message"):  # an error sent as a 200
            raise ProviderFailure("serper answered an error", status=200, retryable=False, said=str(body["message"]))
        if "organic" not in body:
            raise _shape(self.name, "no 'organic' results")
        return _hits(self.name, body["organic"], "link", "snippet", k)

    def error_message(self, body: Any) -> str | None:
        return str(body["message"]) if isinstance(body, dict) and body.get("message") else None


class SerpApi(Provider):
    """serpapi.com: GET search.json?engine=google&q&num&api_key; hits under ``organic_results``; an ``error`` key is a
    failure, except its documented 'no results' answer (as is ``search_information.organic_results_state`` 'Fully
    empty')."""

    name, default_url, key_env = "serpapi", "https://serpapi.com/search.json", "SERPAPI_API_KEY"

    def request(self, base_url: str, query: str, k: int, key: str) -> ProviderRequest:
        params = {"engine": "google", "q": query, "num": str(min(k, self.max_k)), "api_key": key}
        return ProviderRequest("GET", base_url, params=params)

    def results(self, body: dict, k: int) -> list[WebHit]:
        error = body.get("error")
        if error is not None:
            if _SERPAPI_EMPTY in str(error):
                return []
            raise ProviderFailure("serpapi answered an error", status=200, retryable=False, said=str(error))
        if "organic_results" not in body:
            info = body.get("search_information")
            if isinstance(info, dict) and info.get("organic_results_state") == "Fully empty":
                return []
            raise _shape(self.name, "no 'organic_results'")
        return _hits(self.name, body["organic_results"], "link", "snippet", k)

    def error_message(self, body: Any) -> str | None:
        return str(body["error"]) if isinstance(body, dict) and body.get("error") else None


class Brave(Provider):
    """api.search.brave.com: GET web/search?q&count (at most 20) with X-Subscription-Token; a ``search`` answer with
    hits under ``web.results`` (no ``web`` block: no results), descriptions in HTML."""

    name, default_url, key_env = "brave", "https://api.search.brave.com/res/v1/web/search", "BRAVE_API_KEY"
    max_k = 20

    def request(self, base_url: str, query: str, k: int, key: str) -> ProviderRequest:
        headers = {"X-Subscription-Token": key, "Accept": "application/json"}
        return ProviderRequest("GET", base_url, params={"q": query, "count": str(min(k, self.max_k))}, headers=headers)

    def results(self, body: dict, k: int) -> list[WebHit]:
        if body.get("type") == "ErrorResponse":
            raise ProviderFailure("brave answered an error", status=200, retryable=False,
                                  said=self.error_message(body) or "")  # fmt: skip
        if body.get("type") != "search":
            raise _shape(self.name, "its type is not 'search'")
        if "web" not in body:  # the web block is optional: a search without web results
            return []
        web = body["web"]
        if not isinstance(web, dict) or "results" not in web:
            raise _shape(self.name, "'web' holds no results")
        return _hits(self.name, web["results"], "url", "description", k)

    def error_message(self, body: Any) -> str | None:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            return str(error.get("detail") or error.get("code") or "") or None
        return None


PROVIDERS: dict[str, Provider] = {p.name: p for p in (Serper(), SerpApi(), Brave())}
