"""AccessClient: the pages client of one process and event loop, over POST /access with the search client's machinery
(``Transport``: session, deadline, retries, pool, rate limit, endpoint failover; ``CachedCalls``: the LRU page cache
and joining of identical calls in flight).

Invariants: a url is asked for once however many calls want it at the same time; pages are cached by the url the
model asked for, within the cache's entry and byte bounds; a url the service has no page for is not cached (the
answer may change, e.g. a web backend's fetch), but calls in flight for it share its one answer.
"""

from __future__ import annotations

import sys

from verl_search.tool.cache import ENTRY_OVERHEAD, CachedCalls, LRUCache
from verl_search.tool.config import AccessToolConfig
from verl_search.tool.limits import Endpoint
from verl_search.tool.stats import ACCESS_STATS, SearchStats
from verl_search.tool.transport import SharedClient, Transport
from verl_search.tool.wire import Page, access_body, parse_pages


def page_bytes(url: str, page: Page) -> int:
    """An estimate of the memory one cached page holds."""
    strings = (url, page.url, page.title, page.contents)
    return ENTRY_OVERHEAD + sum(sys.getsizeof(s) for s in strings)


class AccessClient(SharedClient):
    """Reads pages from one or more /access endpoints. Use :meth:`shared` to get the process/loop-wide instance."""

    def __init__(self, config: AccessToolConfig, *, stats: SearchStats = ACCESS_STATS) -> None:
        self.config = config
        self.stats = stats
        self.transport = Transport(config.access_urls, config, stats)
        self.cache: LRUCache[str, Page] = LRUCache(config.cache_size, config.cache_max_bytes, weigh=page_bytes)
        self._calls: CachedCalls[str, Page | None] = CachedCalls(self.cache, stats, keep=lambda page: page is not None)

    async def page(self, url: str, *, deadline: float) -> tuple[Page | None, bool, bool]:
        """The page of ``url`` (None: the service has none), whether it came from the cache and whether it joined a
        call in flight."""

        async def fetch(urls: list[str]) -> list[Page | None]:
            return await self.transport.call(lambda endpoint: self._attempt(endpoint, urls, deadline), deadline)

        pages, hits, joined = await self._calls.get([url], fetch, deadline=deadline, late=self.transport.deadline_error)
        return pages[0], hits > 0, joined > 0

    async def _attempt(self, endpoint: Endpoint, urls: list[str], deadline: float) -> list[Page | None]:
        body = await self.transport.post(endpoint, access_body(urls), self.transport.attempt_timeout(deadline))
        return parse_pages(body, urls)
