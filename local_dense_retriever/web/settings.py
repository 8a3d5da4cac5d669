"""WebSettings: every setting of the web backend (``--backend web``), declared once; ``config.ServerConfig`` extends
it, so each is a flag of the server like the others."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WebProvider = Literal["serper", "serpapi", "brave"]
WebCacheMode = Literal["live", "cache_first", "replay"]


class WebSettings(BaseModel):
    """A search provider's API behind /retrieve, with a durable cache and a budget; the pages of POST /access."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    web_provider: WebProvider = "serper"
    """--backend web: the search API called (serper, serpapi or brave)."""
    web_base_url: str | None = None
    """--backend web: the provider's endpoint URL; default its public one (point it at a local stub to test)."""
    web_api_key_env: str | None = None
    """--backend web: name of the environment variable holding the API key; default SERPER_API_KEY, SERPAPI_API_KEY or
    BRAVE_API_KEY by provider. Replay mode needs no key."""
    web_cache_mode: WebCacheMode = "cache_first"
    """--backend web: 'cache_first' answers from the cache and calls the provider on a miss; 'live' always calls (and
    records); 'replay' answers from the cache only, a miss failing as not_cached (no call is ever made)."""
    web_cache_path: Path | None = None
    """--backend web: SQLite file of the cached answers and the budget ledger; default cache_dir/web_search.sqlite3."""
    web_budget_scope: str = Field(default="default", min_length=1, max_length=200)
    """--backend web: name of the run whose live calls and spend the ledger counts; the count survives restarts, so a
    restarted server continues its run's budget. A new name starts a new run."""
    web_max_live_calls: int | None = Field(default=None, ge=0)
    """--backend web: most live provider calls this run (budget scope) may make; then queries that miss the cache fail
    as budget_exhausted. None: no ceiling."""
    web_cost_per_call: float = Field(default=0.0, ge=0)
    """--backend web: USD one live call costs, for the spend in /metrics and for web_max_spend."""
    web_max_spend: float | None = Field(default=None, ge=0)
    """--backend web: most USD this run (budget scope) may spend on live calls. None: no ceiling."""
    web_qps: float = Field(default=5.0, gt=0)
    """--backend web: most live calls per second, shared by every query of this server (a token bucket)."""
    web_timeout_s: float = Field(default=10.0, gt=0)
    """--backend web: deadline of one query's live call, retries included."""
    web_max_attempts: int = Field(default=3, ge=1, le=10)
    """--backend web: attempts per live call; 429, 5xx, timeouts and dropped connections are retried with exponential
    backoff and jitter (at least the provider's Retry-After)."""
    web_fetch_max_bytes: int = Field(default=2 << 20, ge=1024, le=64 << 20)
    """--backend web, POST /access: most body bytes read per fetched page; a longer page is cut there and marked
    truncated."""
    web_fetch_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """--backend web, POST /access: deadline of one page fetch, name resolution and redirects included; past it the
    url answers null."""
    web_fetch_max_concurrency: int = Field(default=16, ge=1, le=1024)
    """--backend web, POST /access: most pages fetched at once by the whole server (page fetches are not charged to the
    search budget; this is their limit)."""
    web_fetch_max_urls: int = Field(default=64, ge=1)
    """--backend web, POST /access: most urls one request may ask for (each may need a fetch of up to
    --web_fetch_timeout_s); a longer list is refused with 422 before anything is looked up or fetched."""
    web_fetch_allow_loopback: bool = False
    """--backend web, POST /access: also fetch pages from loopback addresses (127.0.0.0/8, ::1). For tests against a
    local page server only: never on a server that models or users can reach."""
