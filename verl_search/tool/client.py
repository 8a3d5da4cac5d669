"""RetrievalClient: the search client of one process and event loop, over a :class:`Transport` (session, deadline,
retries, pool, rate limit, endpoint balancing), with the LRU result cache, coalescing of identical in-flight queries
(``cache.CachedCalls``) and both wire forms of /retrieve.

Invariants: no call outlives its deadline; only timeouts, connection errors, 429 and 503 are retried; every failure
is a typed :class:`RetrievalError`; a shared in-flight query is never cancelled because one of its waiters gave up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from verl_search.errors import RequestRejected, RetrievalError
from verl_search.protocol import Document
from verl_search.tool.cache import CachedCalls, LRUCache
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.limits import Endpoint
from verl_search.tool.stats import STATS, SearchStats
from verl_search.tool.transport import SharedClient, Transport
from verl_search.tool.wire import FORM_NAMES, batch_body, parse_hits, parse_single, single_body

logger = logging.getLogger(__name__)

CacheKey = tuple[str, int]


class RetrievalClient(SharedClient):
    """Talks to one or more /retrieve endpoints. Use :meth:`shared` to get the process/loop-wide instance."""

    def __init__(self, config: SearchToolConfig, *, stats: SearchStats = STATS) -> None:
        self.config = config
        self.stats = stats
        self.transport = Transport(config.retrieval_service_url, config, stats)
        self.cache: LRUCache[CacheKey, list[Document]] = LRUCache(config.cache_size, config.cache_max_bytes)
        self._calls = CachedCalls(self.cache, stats)

    async def search(
        self, queries: Sequence[str], topk: int, *, deadline: float
    ) -> tuple[list[list[Document]], int, int]:
        """Hits per (normalised) query, how many came from the cache and how many joined a call in flight."""

        async def fetch(keys: list[CacheKey]) -> list[list[Document]]:
            return await self._request([q for q, _ in keys], topk, deadline)

        keys = [(q, topk) for q in queries]
        return await self._calls.get(keys, fetch, deadline=deadline, late=self.transport.deadline_error)

    async def _request(self, queries: list[str], topk: int, deadline: float) -> list[list[Document]]:
        return await self.transport.call(lambda endpoint: self._attempt(endpoint, queries, topk, deadline), deadline)

    async def _attempt(
        self, endpoint: Endpoint, queries: list[str], topk: int, deadline: float
    ) -> list[list[Document]]:
        """One attempt in the endpoint's wire form; in ``auto`` mode an endpoint of unknown form that rejects the
        batch form with a 4xx gets the single-query form once, and keeps it if that works."""
        wire = endpoint.wire if self.config.request_format == "auto" else self.config.request_format
        if wire == "skyrl":
            return await self._post_each(endpoint, queries, topk, deadline)
        try:
            timeout = self.transport.attempt_timeout(deadline)
            body = await self.transport.post(endpoint, batch_body(queries, topk), timeout)
            hits = parse_hits(body, len(queries))
        except RequestRejected as rejected:
            if wire is not None:
                raise
            try:
                hits = await self._post_each(endpoint, queries, topk, deadline)
            except RetrievalError:
                raise rejected from None
            endpoint.wire = "skyrl"
            logger.warning("retrieval endpoint %s speaks the %s", endpoint.url, FORM_NAMES["skyrl"])
            return hits
        if wire is None:
            endpoint.wire = "search_r1"
        return hits

    async def _post_each(
        self, endpoint: Endpoint, queries: list[str], topk: int, deadline: float
    ) -> list[list[Document]]:
        """The single-query form: one concurrent request per query (within this attempt's worker slot)."""
        timeout = self.transport.attempt_timeout(deadline)

        async def one(query: str) -> list[Document]:
            return parse_single(await self.transport.post(endpoint, single_body(query, topk), timeout))

        tasks = [asyncio.ensure_future(one(q)) for q in queries]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
