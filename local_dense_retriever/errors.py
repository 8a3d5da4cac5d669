"""Every failure of the retrieval service, as one tree under ``RetrieverError``: the CLIs print the one-line message
of a loading error; a ``RequestError`` is a request's answer, its ``status`` and ``kind`` with its message as the
detail (``wire.error_answer``, the one place that renders it). Each class also derives from the builtin its callers
catch (``RuntimeError``, ``ValueError``). Subtrees defined beside their one user:
``web.errors`` (WebSetupError and the QueryFailed kinds of the web backend), ``web.fetch_errors`` (FetchError),
``artifacts.sources`` (DownloadError), ``serve.errors`` (ServeSetupError, which needs no ray)."""

from __future__ import annotations


class RetrieverError(Exception):
    """Root of every error the retrieval service raises."""


class CorpusError(RetrieverError, RuntimeError):
    """The corpus file is missing, compressed, or a row cannot be read as a JSON document."""


class EncoderError(RetrieverError, RuntimeError):
    """The encoder model cannot be loaded."""


class IndexLoadError(RetrieverError, RuntimeError):
    """The index file is missing, of the wrong kind for the backend, or does not fit the encoder."""


class PagesError(RetrieverError, RuntimeError):
    """The pages file is missing or unreadable."""


class RerankerError(RetrieverError, RuntimeError):
    """The rerank stage's cross-encoder cannot be loaded, or its head is not a relevance score."""


class RequestError(RetrieverError):
    """A request answered with an error: HTTP ``status``, error ``kind`` (also its /metrics label), the message as
    the body's ``detail``; ``close`` asks for the connection to be closed after the answer."""

    status = 500
    kind = "internal_error"
    close = False


class ClientDisconnected(RequestError, ConnectionError):
    """The client went away before its answer: nothing is sent (recorded with nginx's 499)."""

    status = 499
    kind = "client_disconnected"


class BodyTooLarge(RequestError, ValueError):
    """The request body exceeds ``--max_body_bytes``."""

    status = 413
    kind = "body_too_large"


class BodyTimeout(RequestError, TimeoutError):
    """The request body did not arrive within ``--body_timeout_s``; the connection is closed after the answer."""

    status = 408
    kind = "body_timeout"
    close = True


class InvalidJson(RequestError, ValueError):
    """The request body is not JSON."""

    status = 400
    kind = "invalid_json"


class InvalidRequest(RequestError, ValueError):
    """The request body is JSON but not a valid request, or out of the server's limits."""

    status = 422
    kind = "invalid_request"


class NotReady(RequestError, RuntimeError):
    """The server is still loading, or its load failed."""

    status = 503
    kind = "not_ready"


class Overloaded(RequestError, RuntimeError):
    """The queue is full; the caller should retry later (HTTP 429)."""

    status = 429
    kind = "overloaded"


class BatcherStopped(RequestError, RuntimeError):
    """The batcher is not running (shutting down, or its worker died)."""

    status = 503
    kind = "unavailable"


class QueryRejected(RequestError, ValueError):
    """This request's queries made the engine fail while the other requests of the same batch were answered."""

    status = 422
    kind = "invalid_query"


class QueryFailed(RequestError, RuntimeError):
    """One query failed on its own: a document backend returns this in the query's result slot (never raises it for
    the batch), and the request holding the query is answered ``status`` with error ``kind``."""
