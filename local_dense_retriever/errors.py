"""Every failure of the retrieval service, as one tree under ``RetrieverError``: the CLIs print the one-line message
of a loading error; ``retrieve.py`` answers the request-time ones with JSON statuses. Each class also derives from the
builtin its callers catch (``RuntimeError``, ``ValueError``). Subtrees defined beside their one user:
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


class Overloaded(RetrieverError, RuntimeError):
    """The queue is full; the caller should retry later (HTTP 429)."""


class BatcherStopped(RetrieverError, RuntimeError):
    """The batcher is not running (shutting down, or its worker died)."""


class QueryRejected(RetrieverError, ValueError):
    """This request's queries made the engine fail while the other requests of the same batch were answered."""


class QueryFailed(RetrieverError, RuntimeError):
    """One query failed on its own: a document backend returns this in the query's result slot (never raises it for
    the batch), and the request holding the query is answered ``status`` with error ``kind``."""

    status = 500
    kind = "internal_error"
