"""The errors of fetching a web page for ``POST /access`` (``fetch.py``): each answers null for its url and is counted
by ``kind``; part of the service's error tree (``local_dense_retriever/errors.py``)."""

from __future__ import annotations

from local_dense_retriever.errors import RetrieverError


class FetchError(RetrieverError, RuntimeError):
    """A web page could not be fetched for ``POST /access``; the message names the url, never the page body.
    ``kind`` labels the failure in /metrics and the log."""

    kind = "fetch_failed"


class BadUrl(FetchError, ValueError):
    """Not an http(s) URL with a host, or it carries userinfo, control characters or a refused port."""

    kind = "bad_url"


class AddressRefused(FetchError):
    """The host is, or resolves to, an address off the public internet (loopback, private, link-local, ...)."""

    kind = "address_refused"


class TooManyRedirects(FetchError):
    """More redirects than allowed, or a redirect back to a url already visited."""

    kind = "too_many_redirects"


class UnsupportedContent(FetchError):
    """The page is not HTML or plain text, or its body is compressed."""

    kind = "unsupported_content"


class UpstreamStatus(FetchError):
    """The site answered an error status (``status``)."""

    kind = "upstream_status"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class UpstreamFailed(FetchError):
    """The host name did not resolve, the connection or TLS handshake failed, or the reply was not valid HTTP."""

    kind = "upstream_failed"


class FetchTimeout(FetchError, TimeoutError):
    """The page's total deadline (resolution, redirects and body included) passed."""

    kind = "fetch_timeout"
