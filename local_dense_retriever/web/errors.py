"""The web backend's errors: it cannot start, or one query's search failed (``QueryFailed``: the request holding the
query is answered ``status`` with error ``kind``, its batch-mates are answered)."""

from __future__ import annotations

from local_dense_retriever.errors import QueryFailed, RetrieverError


class WebSetupError(RetrieverError, RuntimeError):
    """The web backend cannot start: its API key variable is unset (named, never its value), or its cache unusable."""


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
