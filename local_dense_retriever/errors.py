"""Every failure of the retrieval service, as one tree under ``RetrieverError`` (the CLIs print the one-line message;
the HTTP layer maps the request-time ones to JSON statuses in ``app.py``). Each class also derives from the builtin
that callers caught before the tree existed (``RuntimeError``, ``ValueError``), so no caller breaks.

RetrieverError
├── loading (the server exits 1 with the message)
│   ├── CorpusError            the corpus file is missing, compressed, or a row is not a JSON document
│   ├── EncoderError           the encoder model cannot be loaded
│   ├── IndexLoadError         the index file is missing, of the wrong kind, or does not fit the encoder
│   ├── PagesError             the pages file is missing or unreadable
│   ├── WebSetupError          the web backend cannot start (its API key variable is unset, its cache unusable)
│   └── RerankerError          the rerank stage's cross-encoder cannot be loaded or is not a relevance scorer
├── request time (``app.py`` answers them)
│   ├── Overloaded             the queue is full: 429, the caller retries later
│   ├── BatcherStopped         the batcher is not running (shutting down, or its worker died): 503
│   ├── QueryRejected          this request's text makes the engine fail while its batch-mates were answered: 422
│   └── QueryFailed            one query failed on its own; its request gets ``status`` and ``kind``, batch-mates
│       │                      are answered (returned in the query's result slot by a document backend: web/)
│       ├── BudgetExhausted    the run's live-call or spend ceiling is reached: 503 budget_exhausted
│       ├── NotCached          replay mode and the query is not in the cache: 503 not_cached
│       ├── RateLimited        the web provider's rate (--web_qps) has no slot before the query's deadline: 429
│       └── UpstreamError      the web search provider keeps failing or refuses the key: 502 upstream_error
├── web.providers.ProviderFailure   one attempt at a web provider failed (retried, or turned into UpstreamError)
├── web.fetch_errors.FetchError  a web page for POST /access could not be fetched (web/fetch.py): that url is null,
│   │                          counted in /metrics by the class's ``kind``
│   ├── BadUrl                 not an http(s) URL with a host, or it carries userinfo, control characters or a
│   │                          refused port
│   ├── AddressRefused         the host is, or resolves to, an address off the public internet
│   ├── TooManyRedirects       more redirects than allowed, or a redirect loop
│   ├── UnsupportedContent     a content type other than HTML or plain text, or an encoded body
│   ├── UpstreamStatus         the site answered an error status
│   ├── UpstreamFailed         the name did not resolve, the connection or TLS failed, or the reply was not HTTP
│   └── FetchTimeout           the page's deadline (redirects included) passed
├── DownloadError              a download could not be completed (artifacts/)
│   ├── SourceUnreachable      no network, HF_HUB_OFFLINE, a closed mirror endpoint
│   └── SizeMismatch           a file's size differs from what the source declares
├── ServeSetupError            the Ray Serve fleet could not start (defined in serve/errors.py, which needs no ray)
│   ├── ServeExtraMissing, RayUnreachable, ShardingError, DeploymentFailed
└── QueueInvariantError        the batcher's queue counts disagree with its contents (a bug; tests check for it)
"""

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


class WebSetupError(RetrieverError, RuntimeError):
    """The web backend cannot start: its API key variable is unset (named, never its value), or its cache unusable."""


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


class BudgetExhausted(QueryFailed):
    """The run's ceiling on live web calls or on spend is reached; cached answers are still served."""

    status = 503
    kind = "budget_exhausted"


class NotCached(QueryFailed):
    """Replay mode: the query has no cached answer, and replay never calls the provider."""

    status = 503
    kind = "not_cached"


class RateLimited(QueryFailed):
    """The shared rate limit of live web calls has no slot before this query's deadline; a client retries later."""

    status = 429
    kind = "rate_limited"


class UpstreamError(QueryFailed):
    """The web search provider failed after the allowed retries, timed out, or refused the request or the key."""

    status = 502
    kind = "upstream_error"


class DownloadError(RetrieverError, RuntimeError):
    """A download could not be completed; the message is one line that says why and what to do."""


class SourceUnreachable(DownloadError):
    """The source cannot be reached at all (no network, HF_HUB_OFFLINE, a closed mirror endpoint)."""


class SizeMismatch(DownloadError):
    """A file's size differs from what the source declares (a truncated or corrupt transfer)."""


class QueueInvariantError(RetrieverError, AssertionError):
    """The queue's counts disagree with its contents (a bug; ``FairQueue.check`` raises it)."""
