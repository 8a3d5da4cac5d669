"""WebSearch: the engine's search backend for ``--backend web``. Its hits are documents (no corpus rows): each one
``{"id", "contents": '"<title>"\\n<snippet>', "url"}`` scored by rank (1, 1/2, 1/3, ...). It also serves the pages of
``POST /access`` (``access.WebPages``: the cache file's pages, else a live fetch) on the same event loop.

Invariants: a failed query is returned as its ``QueryFailed`` in its own result slot, never raised for the batch; a
replay never calls the provider; identical queries in flight in this process share one live call; every live answer
is recorded (its hits cleaned and cut by the provider's adapter) before it is returned, and a failure never is; the
key is held as a secret and appears in no text this module makes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from local_dense_retriever.errors import QueryFailed
from local_dense_retriever.web.access import WebPages
from local_dense_retriever.web.cache import WebStore, normalize_query
from local_dense_retriever.web.caller import LiveCaller
from local_dense_retriever.web.errors import NotCached, RateLimited, UpstreamError, WebSetupError
from local_dense_retriever.web.fetch import FetchConfig, PageFetcher
from local_dense_retriever.web.limits import Budget
from local_dense_retriever.web.providers import PROVIDERS, WebHit
from verl_search.pacing import TokenBucket

if TYPE_CHECKING:
    from local_dense_retriever.config import ServerConfig

logger = logging.getLogger(__name__)

Hit = tuple[dict, float]


def document(hit: WebHit) -> dict:
    """The Search-R1 document of a web hit; its id is a hash of the url, so the same page keeps its id."""
    doc_id = "web-" + hashlib.sha256(hit.url.encode("utf-8")).hexdigest()[:16]
    return {"id": doc_id, "contents": f'"{hit.title}"\n{hit.snippet}', "url": hit.url}


def scored(hits: list[WebHit]) -> list[Hit]:
    return [(document(h), 1.0 / (rank + 1)) for rank, h in enumerate(hits)]


def cache_path_for(config: ServerConfig) -> Path:
    return config.web_cache_path or config.cache_dir / "web_search.sqlite3"


def api_key_env(config: ServerConfig) -> str:
    """The name of the environment variable holding the provider's API key."""
    return config.web_api_key_env or PROVIDERS[config.web_provider].key_env


def api_key(config: ServerConfig) -> SecretStr | None:
    """The key from the variable the config names (None in replay, which needs none); unset is a start-up error."""
    if config.web_cache_mode == "replay":
        return None
    name = api_key_env(config)
    value = os.environ.get(name, "").strip()
    if not value:
        raise WebSetupError(
            f"--backend web --web_provider {config.web_provider} --web_cache_mode {config.web_cache_mode}: the "
            f"environment variable {name} holding the API key is not set (or use --web_cache_mode replay)"
        )
    return SecretStr(value)


def page_fetcher(config: ServerConfig) -> PageFetcher | None:
    """The fetcher of /access pages the config asks for; None in replay, which never fetches."""
    if config.web_cache_mode == "replay":
        return None
    if config.web_fetch_allow_loopback:
        logger.warning("--web_fetch_allow_loopback: /access may fetch pages from this machine (for tests only)")
    return PageFetcher(FetchConfig(max_bytes=config.web_fetch_max_bytes, deadline_s=config.web_fetch_timeout_s,
                                   max_concurrency=config.web_fetch_max_concurrency,
                                   allow_loopback=config.web_fetch_allow_loopback))  # fmt: skip


class WebSearch:
    """Search through the provider's API, behind the durable cache, the run's budget and the rate limit. ``search``
    is called from the engine's threads; the calls run on this backend's own event loop thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.provider = PROVIDERS[config.web_provider]
        self.mode = config.web_cache_mode
        key = api_key(config)
        self.store = WebStore(cache_path_for(config))
        self.budget = Budget(self.store, config.web_budget_scope, max_calls=config.web_max_live_calls,
                             max_spend=config.web_max_spend, cost_per_call=config.web_cost_per_call)  # fmt: skip
        self.lookups = self.cache_hits = self.replay_misses = self.joined = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="web-search", daemon=True)
        self._thread.start()
        self.caller: LiveCaller | None = None
        if key is not None:
            bucket = TokenBucket(config.web_qps, late=RateLimited, clock=self._loop.time)
            self.caller = LiveCaller(self.provider, config.web_base_url or self.provider.default_url, key,
                                     budget=self.budget, bucket=bucket, timeout_s=config.web_timeout_s,
                                     max_attempts=config.web_max_attempts)  # fmt: skip
        self._flights: dict[tuple[str, int], asyncio.Future[list[WebHit]]] = {}
        self.web_pages = WebPages(self.store, page_fetcher(config), self.mode)
        if self.caller is not None and config.web_max_live_calls is None and config.web_max_spend is None:
            logger.warning("--backend web: no --web_max_live_calls or --web_max_spend: live calls are not capped")

    def __len__(self) -> int:
        """Answers in the cache."""
        return len(self.store)

    def search(self, queries: list[str], k: int) -> list[list[Hit] | QueryFailed]:
        """Per query, its top-``k`` hits or the ``QueryFailed`` that query met."""
        return asyncio.run_coroutine_threadsafe(self._search(queries, k), self._loop).result()

    async def asearch(self, queries: list[str], k: int) -> list[list[Hit] | QueryFailed]:
        """``search`` awaited from the server's loop. A caller that goes away leaves the calls running on this loop:
        a live answer being paid for is still recorded."""
        work = asyncio.run_coroutine_threadsafe(self._search(queries, k), self._loop)
        return await asyncio.shield(asyncio.wrap_future(work))

    async def pages(self, urls: list[str]) -> list[dict | None]:
        """``POST /access``: the page of each url, or None (awaited from the server's loop, run on this one's)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.web_pages.get(urls), self._loop))

    def close(self) -> None:
        """Close the HTTP session and the cache and stop the loop thread (a second call does nothing)."""
        if self._loop.is_closed():
            return
        if self.caller is not None:
            asyncio.run_coroutine_threadsafe(self.caller.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self.store.close()

    async def _search(self, queries: list[str], k: int) -> list[list[Hit] | QueryFailed]:
        answers = await asyncio.gather(*(self._one(q, k) for q in queries), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, QueryFailed):
                raise answer  # a bug, not a query's failure: the batch fails loudly
        return [a if isinstance(a, QueryFailed) else scored(a) for a in answers]

    async def _one(self, query: str, k: int) -> list[WebHit]:
        key = normalize_query(query)
        if not key:
            return []  # nothing to search for: no call, no charge
        self.lookups += 1
        if self.mode != "live":
            cached = self.store.get(self.provider.name, key, k)
            if cached is not None:
                self.cache_hits += 1
                return cached
        if self.caller is None:  # replay
            self.replay_misses += 1
            raise NotCached(f"{_quoted(query)} has no cached {self.provider.name} answer for top {k} (replay mode "
                            "never calls the provider)")  # fmt: skip
        flight = self._flights.get((key, k))
        if flight is not None:
            self.joined += 1
            return await asyncio.shield(flight)
        flight = self._flights[(key, k)] = self._loop.create_future()
        try:
            hits = await self._live(key, k)
        except BaseException as e:
            flight.set_exception(e if isinstance(e, Exception) else asyncio.CancelledError())
            flight.exception()  # retrieved here: a flight nobody joined must not warn
            raise
        else:
            flight.set_result(hits)
        finally:
            del self._flights[(key, k)]
        return hits

    async def _live(self, key: str, k: int) -> list[WebHit]:
        """A live call's hits, recorded; any failure is this query's ``QueryFailed`` (were it raised for the batch,
        the batch's isolation retry would call, and bill, the provider again)."""
        assert self.caller is not None
        name = self.provider.name
        try:
            hits = await self.caller.call(key, k)
        except QueryFailed:
            raise
        except Exception as e:
            logger.error("%s: a live call failed in our code: %s", name, type(e).__name__)
            raise UpstreamError(f"upstream_error: {name}: the call failed here ({type(e).__name__})") from None
        try:
            self.store.put(name, key, k, hits)
        except (sqlite3.Error, OSError) as e:  # answered all the same: it was paid for
            logger.error("cannot record a %s answer in %s: %s", name, self.store.path.name, e)
        return hits

    def stats(self) -> dict:
        """The /metrics block of the web backend."""
        caller, budget = self.caller, self.budget
        return {
            "provider": self.provider.name,
            "mode": self.mode,
            "lookups_total": self.lookups,
            "cache_hits_total": self.cache_hits,
            "cache_hit_rate": self.cache_hits / self.lookups if self.lookups else None,
            "cached_answers": len(self.store),
            "live_requests_total": caller.requests_sent if caller is not None else 0,
            "joined_in_flight_total": self.joined,
            "upstream_failures_total": caller.failures if caller is not None else 0,
            "budget_scope": budget.scope,
            "run_live_calls": budget.live_calls,
            "run_spend_usd": budget.spend,
            "budget_refusals_total": budget.refusals,
            "replay_misses_total": self.replay_misses,
            **self.web_pages.stats(),
        }

    def describe(self) -> str:
        """One line for /health: provider, mode, cache and budget."""
        rate = f"{self.cache_hits / self.lookups:.0%}" if self.lookups else "n/a"
        return (
            f"web search ({self.provider.name}, {self.mode}); cache {self.store.path.name}: "
            f"{len(self.store):,} answers, hit rate {rate} of {self.lookups:,} lookups; "
            f"run {self.budget.scope!r}: {self.budget.describe()}, {self.budget.refusals} budget refusals, "
            f"{self.replay_misses} replay misses"
        )


def _quoted(query: str, limit: int = 80) -> str:
    return repr(query if len(query) <= limit else query[:limit] + "...")
