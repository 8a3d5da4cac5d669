"""SearchToolConfig and AccessToolConfig: every key of the tools' YAML ``config:`` blocks, its default and meaning,
declared once (the keys both share in ``ClientConfig``).

Unknown keys are an error naming the key; values are checked when verl builds the tool, never mid-rollout.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from verl_search.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000/retrieve"

#: keys of verl ≤0.5's search tool config that mean nothing here: accepted, with one warning per key and process
DEPRECATED_KEYS: dict[str, str] = {
    "enable_global_rate_limit": "verl ≤0.5's cluster-wide Ray rate limiter; rate_limit is a token bucket per process"
}
_warned: set[str] = set()


def normalise_endpoint(url: str, route: str = "/retrieve", key: str = "retrieval_service_url") -> str:
    """``http://host:port`` or ``http://host:port/`` → ``http://host:port/retrieve`` (or ``route``); other paths are
    kept."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{key} {url!r} is not an http(s) URL like 'http://127.0.0.1:8000{route}'")
    path = parts.path if parts.path not in ("", "/") else route
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def access_endpoint(retrieve_url: str) -> str:
    """The ``/access`` endpoint beside a (normalised) ``/retrieve`` one: ``http://h/x/retrieve`` → ``http://h/x/access``."""
    parts = urlsplit(retrieve_url)
    if not parts.path.endswith("/retrieve"):
        raise ValueError(
            f"the /access URL cannot be derived from retrieval_service_url {retrieve_url!r} (its path does not end in "
            "/retrieve); set access_url"
        )
    path = parts.path[: -len("retrieve")] + "access"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _url_list(value: Any, key: str) -> list[str]:
    """One URL or a non-empty list of URL strings, as a list."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{key} must be a URL or a non-empty list of URLs")
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"{key} entries must be strings, got {type(item).__name__}")
    return list(value)


class ClientConfig(BaseModel):
    """The keys every tool of ours that calls the retrieval service shares: where it is, the HTTP client's limits
    (pool, rate, deadline, retries, ejection), the per-process cache and the stats log."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: what error messages call the tool whose config this is
    tool_label: ClassVar[str] = "tool"

    type: Literal["native"] = Field(default="native", description="verl tool type; must be 'native'.")
    retrieval_service_url: tuple[str, ...] = Field(
        default=(DEFAULT_URL,),
        description="One URL or a list of URLs of /retrieve endpoints; a bare host:port gets '/retrieve' appended. "
        "With several, calls go to the endpoint with the fewest requests in flight and fail over.",
    )
    num_workers: int = Field(default=120, ge=1, le=100_000, description="Max concurrent HTTP requests per process.")
    rate_limit: float | None = Field(
        default=120.0, ge=0, description="Requests per second per process (token bucket); null or 0 = unlimited."
    )
    timeout: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("timeout", "default_timeout"),
        description="Deadline of one tool call in seconds, queueing and retries included (alias: default_timeout).",
    )
    attempt_timeout: float = Field(
        default=10.0, gt=0, description="Deadline of one HTTP attempt in seconds (capped by what is left of timeout)."
    )
    max_attempts: int = Field(
        default=3, ge=1, le=10, description="HTTP attempts per call; retried on timeouts, connection errors, 429, 503."
    )
    backoff_base: float = Field(
        default=0.1, ge=0, description="First retry waits up to this many seconds (full jitter), doubling each time."
    )
    backoff_max: float = Field(default=2.0, ge=0, description="Cap on a single backoff wait in seconds.")
    eject_seconds: float = Field(
        default=1.0, ge=0, description="A failing endpoint is skipped this long, doubling per failed re-probe."
    )
    eject_max_seconds: float = Field(default=10.0, ge=0, description="Cap on one ejection in seconds.")
    cache_size: int = Field(
        default=100_000, ge=0, description="Entries of the per-process LRU cache of answers; 0 = off."
    )
    cache_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="Estimated bytes the per-process cache may hold; 0 = off."
    )
    stats_log_interval: float = Field(
        default=300.0, ge=0, description="Seconds between log lines with the per-process counters; 0 = never."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_deprecated(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        raw = dict(raw)
        for key, why in DEPRECATED_KEYS.items():
            if key in raw:
                raw.pop(key)
                if key not in _warned:
                    _warned.add(key)
                    logger.warning("%s config key '%s' is deprecated and ignored (%s)", cls.tool_label, key, why)
        return raw

    @field_validator("retrieval_service_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys(normalise_endpoint(u) for u in _url_list(value, "retrieval_service_url")))

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Self:
        """Build from the YAML ``config:`` mapping; raise :class:`ConfigError` naming each bad key."""
        try:
            return cls.model_validate(dict(raw or {}))
        except ValidationError as e:
            problems = []
            for err in e.errors():
                key = ".".join(str(p) for p in err["loc"]) or "config"
                if err["type"] == "extra_forbidden":
                    problems.append(f"unknown key '{key}' (known keys: {', '.join(sorted(cls.known_keys()))})")
                else:
                    problems.append(f"'{key}': {err['msg']}")
            raise ConfigError(f"invalid {cls.tool_label} config: " + "; ".join(problems)) from e

    @classmethod
    def known_keys(cls) -> set[str]:
        return set(cls.model_fields) | {"default_timeout"} | set(DEPRECATED_KEYS)


class SearchToolConfig(ClientConfig):
    """Configuration of :class:`verl_search.SearchTool` (and of the native ``search_r1_agent`` loop)."""

    tool_label: ClassVar[str] = "search tool"

    topk: int = Field(default=3, ge=1, le=100, description="Passages returned per query.")
    request_format: Literal["auto", "search_r1", "skyrl"] = Field(
        default="auto",
        description="Wire form of /retrieve: 'search_r1' = one request per call ({queries: [...]}); 'skyrl' = one "
        "request per query ({query: str}); 'auto' = the batch form, switching an endpoint that rejects it with a 4xx "
        "to the single-query form when that works.",
    )
    max_queries: int = Field(
        default=8, ge=1, le=256, description="Queries per call; extra queries are dropped and the model is told."
    )
    max_query_chars: int = Field(
        default=512, ge=8, le=100_000, description="Characters per query; longer queries are cut and the model is told."
    )
    max_result_chars: int = Field(
        default=6000, ge=100, description="Cap on the text returned to the model for one call (all queries)."
    )
    gc_freeze: bool = Field(
        default=False, description="gc.freeze() the rollout worker's start-up objects once (process-wide, so opt-in)."
    )
    show_urls: bool = Field(
        default=False,
        description="Show each hit's url (where the retriever gives one) as 'Doc 1(Title: T)(URL: u) text', so a "
        "model with the access tool can open it; off keeps Search-R1's exact format.",
    )


class AccessToolConfig(ClientConfig):
    """Configuration of :class:`verl_search.AccessTool`: the transport keys of ``ClientConfig`` plus where /access is
    (``access_url``, else beside each ``retrieval_service_url``) and the size of one window of a page."""

    tool_label: ClassVar[str] = "access tool"

    access_url: tuple[str, ...] | None = Field(
        default=None,
        description="One URL or a list of URLs of /access endpoints (a bare host:port gets '/access' appended); "
        "null = each retrieval_service_url with its '/retrieve' replaced by '/access'.",
    )
    max_result_chars: int = Field(
        default=6000,
        ge=1000,
        description="Cap on the text of one call: a page is read in windows of this size, header and hint included.",
    )

    @field_validator("access_url", mode="before")
    @classmethod
    def _access_urls(cls, value: Any) -> tuple[str, ...] | None:
        if value is None:
            return None
        urls = (normalise_endpoint(u, "/access", "access_url") for u in _url_list(value, "access_url"))
        return tuple(dict.fromkeys(urls))

    @model_validator(mode="after")
    def _derivable(self) -> AccessToolConfig:
        self.access_urls  # noqa: B018 - a retrieval_service_url it cannot derive from fails start-up, not a call
        return self

    @property
    def access_urls(self) -> tuple[str, ...]:
        """The /access endpoints the tool calls."""
        if self.access_url is not None:
            return self.access_url
        return tuple(dict.fromkeys(access_endpoint(u) for u in self.retrieval_service_url))
