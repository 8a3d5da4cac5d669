"""WebPages: the pages ``POST /access`` answers on the web backend. Per url: the page recorded in the web cache file,
else (unless replaying) a live fetch by the PageFetcher, recorded before it is answered; ``live`` mode always fetches.

Invariants: only pages are recorded, never a failure; a url that fails answers None, is counted by its error's kind
and logged as one line naming its host and the kind (never the page or the rest of the url); a call's urls are fetched
together, at most the fetcher's ``max_concurrency`` at once on the backend's loop; replay opens no connection.
Page fetches are not charged to the search budget: they cost nothing at the provider.
"""

from __future__ import annotations

import collections
import logging
from urllib.parse import urlsplit

from local_dense_retriever.web.cache import WebStore
from local_dense_retriever.web.fetch import PageFetcher
from local_dense_retriever.web.fetch_errors import BadUrl, FetchError
from local_dense_retriever.web.settings import WebCacheMode

logger = logging.getLogger(__name__)


def host_of(url: str) -> str:
    """The host of ``url`` for a log line: printable ASCII, at most 100 characters ('?' when there is none)."""
    try:
        host = urlsplit(url).hostname or "?"
    except ValueError:
        host = "?"
    host = host.encode("ascii", "backslashreplace").decode("ascii")
    return host if len(host) <= 100 else host[:100] + "..."


class WebPages:
    """Pages by url from ``store``'s page table and ``fetcher`` (None in replay mode, which never fetches). Called on
    the web backend's event loop thread."""

    def __init__(self, store: WebStore, fetcher: PageFetcher | None, mode: WebCacheMode) -> None:
        self.store, self.fetcher, self.mode = store, fetcher, mode
        self.lookups = self.cache_hits = self.fetches = self.replay_misses = 0
        self.failures: collections.Counter[str] = collections.Counter()

    async def get(self, urls: list[str]) -> list[dict | None]:
        """The page of each url, or None; a url asked twice is looked up and fetched once."""
        found: dict[str, dict | None] = {}
        missing: list[str] = []
        for url in dict.fromkeys(urls):
            self.lookups += 1
            if not _storable(url):  # a lone surrogate: no cache key, no fetch
                found[url] = self._failed(url, BadUrl("url is not valid Unicode text"))
                continue
            page = self.store.get_page(url) if self.mode != "live" else None
            if page is not None:
                self.cache_hits += 1
                found[url] = page
            elif self.fetcher is None:
                self.replay_misses += 1
                found[url] = None
            else:
                missing.append(url)
        if missing:
            assert self.fetcher is not None
            self.fetches += len(missing)
            for url, result in zip(missing, await self.fetcher.fetch_many(missing), strict=True):
                if isinstance(result, FetchError):
                    found[url] = self._failed(url, result)
                else:
                    self.store.put_page(url, result)
                    found[url] = result
        return [found[url] for url in urls]

    def _failed(self, url: str, error: FetchError) -> None:
        self.failures[error.kind] += 1
        logger.info("page fetch failed: host %s, %s", host_of(url), error.kind)
        return None

    def stats(self) -> dict:
        """The page figures of the web backend's /metrics block."""
        failures = dict(self.failures)  # one C-level copy: the loop thread may be counting meanwhile
        return {
            "page_lookups_total": self.lookups,
            "page_cache_hits_total": self.cache_hits,
            "page_fetches_total": self.fetches,
            "page_fetch_failures_total": sum(failures.values()),
            "page_fetch_failures_by_kind": dict(sorted(failures.items())),
            "page_replay_misses_total": self.replay_misses,
            "cached_pages": self.store.pages,
        }


def _storable(url: str) -> bool:
    """Whether ``url`` encodes as UTF-8 (SQLite and HTTP need it; JSON can carry lone surrogates)."""
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
