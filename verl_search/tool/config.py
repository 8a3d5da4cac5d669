"""SearchToolConfig: every key of the tool's YAML ``config:`` block, its default and meaning, declared once.

Unknown keys are an error naming the key; values are checked when verl builds the tool, never mid-rollout.
"""

from __future__ import annotations

import logging
from typing import Any, Literal
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


def normalise_endpoint(url: str) -> str:
    """``http://host:port`` or ``http://host:port/`` → ``http://host:port/retrieve``; other paths are kept."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"retrieval_service_url {url!r} is not an http(s) URL like {DEFAULT_URL!r}")
    path = parts.path if parts.path not in ("", "/") else "/retrieve"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class SearchToolConfig(BaseModel):
    """Configuration of :class:`verl_search.SearchTool` (and of the native ``search_r1_agent`` loop)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: Literal["native"] = Field(default="native", description="verl tool type; must be 'native'.")
    retrieval_service_url: tuple[str, ...] = Field(
        default=(DEFAULT_URL,),
        description="One URL or a list of URLs of /retrieve endpoints; a bare host:port gets '/retrieve' appended. "
        "With several, calls go to the endpoint with the fewest requests in flight and fail over.",
    )
    topk: int = Field(default=3, ge=1, le=100, description="Passages returned per query.")
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
    request_format: Literal["auto", "search_r1", "skyrl"] = Field(
        default="auto",
        description="Wire form of /retrieve: 'search_r1' = one request per call ({queries: [...]}); 'skyrl' = one "
        "request per query ({query: str}); 'auto' = the batch form, switching an endpoint that rejects it with a 4xx "
        "to the single-query form when that works.",
    )
    eject_seconds: float = Field(
        default=1.0, ge=0, description="A failing endpoint is skipped this long, doubling per failed re-probe."
    )
    eject_max_seconds: float = Field(default=10.0, ge=0, description="Cap on one ejection in seconds.")
    max_queries: int = Field(
        default=8, ge=1, le=256, description="Queries per call; extra queries are dropped and the model is told."
    )
    max_query_chars: int = Field(
        default=512, ge=8, le=100_000, description="Characters per query; longer queries are cut and the model is told."
    )
    cache_size: int = Field(
        default=100_000, ge=0, description="Entries of the per-process LRU cache of (query, topk) results; 0 = off."
    )
    cache_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="Estimated bytes the per-process result cache may hold; 0 = off."
    )
    max_result_chars: int = Field(
        default=6000, ge=100, description="Cap on the text returned to the model for one call (all queries)."
    )
    stats_log_interval: float = Field(
        default=300.0, ge=0, description="Seconds between log lines with the per-process counters; 0 = never."
    )
    gc_freeze: bool = Field(
        default=False, description="gc.freeze() the rollout worker's start-up objects once (process-wide, so opt-in)."
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
                    logger.warning("search tool config key '%s' is deprecated and ignored (%s)", key, why)
        return raw

    @field_validator("retrieval_service_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError("retrieval_service_url must be a URL or a non-empty list of URLs")
        urls = []
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"retrieval_service_url entries must be strings, got {type(item).__name__}")
            urls.append(normalise_endpoint(item))
        return tuple(dict.fromkeys(urls))

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SearchToolConfig:
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
            raise ConfigError("invalid search tool config: " + "; ".join(problems)) from e

    @classmethod
    def known_keys(cls) -> set[str]:
        return set(cls.model_fields) | {"default_timeout"} | set(DEPRECATED_KEYS)
