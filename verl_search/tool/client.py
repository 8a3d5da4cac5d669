"""RetrievalClient: one shared aiohttp session per process and event loop, with deadline, retries, pool, rate limit,
endpoint balancing, an LRU result cache, coalescing of identical in-flight queries, and both wire forms of /retrieve.

Invariants: no call outlives its deadline; only timeouts, connection errors, 429 and 503 are retried; every failure
is a typed :class:`RetrievalError`; a shared in-flight query is never cancelled because one of its waiters gave up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import aiohttp

from verl_search.errors import (
    BadResponse,
    BudgetSpent,
    DeadlineExceeded,
    NotCached,
    RequestRejected,
    RetrievalError,
    ServerError,
    ServiceUnavailable,
)
from verl_search.pacing import TokenBucket, backoff_seconds, retry_after_seconds
from verl_search.protocol import Document
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.limits import Endpoint, EndpointSet, WorkerPool
from verl_search.tool.stats import STATS, SearchStats
from verl_search.tool.wire import FORM_NAMES, batch_body, error_reply, parse_hits, parse_single, single_body

logger = logging.getLogger(__name__)

CacheKey = tuple[str, int]

#: estimated bytes of the Python objects around one cache entry / one document, beyond their strings' characters
_ENTRY_OVERHEAD = 200
_DOC_OVERHEAD = 400


def entry_bytes(key: CacheKey, docs: list[Document]) -> int:
    """An estimate of the memory one entry holds: its strings' sizes plus a fixed overhead per object."""
    total = _ENTRY_OVERHEAD + sys.getsizeof(key[0])
    for doc in docs:
        total += _DOC_OVERHEAD + sys.getsizeof(doc.id) + sys.getsizeof(doc.contents)
        for value in (doc.model_extra or {}).values():
            total += sys.getsizeof(value) if isinstance(value, str) else 64
    return total


class LRUCache:
    """The per-process result cache, (query, topk) → documents: never more than ``size`` entries nor ``max_bytes`` of
    estimated memory (a larger entry is not stored; either bound at 0 turns it off); least recently used out first."""

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[CacheKey, tuple[list[Document], int]] = OrderedDict()

    def get(self, key: CacheKey) -> list[Document] | None:
        item = self._data.get(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        return item[0]

    def put(self, key: CacheKey, value: list[Document]) -> None:
        if self.size <= 0 or self.max_bytes == 0:
            return
        cost = entry_bytes(key, value)
        if self.max_bytes is not None and cost > self.max_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._data[key] = (value, cost)
        self.bytes += cost
        while len(self._data) > self.size or (self.max_bytes is not None and self.bytes > self.max_bytes):
            _, (_, evicted) = self._data.popitem(last=False)
            self.bytes -= evicted

    def __len__(self) -> int:
        return len(self._data)


class RetrievalClient:
    """Talks to one or more /retrieve endpoints. Use :meth:`shared` to get the process/loop-wide instance."""

    _instances: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[SearchToolConfig, RetrievalClient]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, config: SearchToolConfig, *, stats: SearchStats = STATS) -> None:
        self.config = config
        self.stats = stats
        self._loop = asyncio.get_running_loop()
        self.endpoints = EndpointSet(
            config.retrieval_service_url, eject_seconds=config.eject_seconds, eject_max_seconds=config.eject_max_seconds
        )
        self.pool = WorkerPool(config.num_workers, clock=self._loop.time)
        self.limiter = None
        if config.rate_limit:
            self.limiter = TokenBucket(config.rate_limit, late=DeadlineExceeded, clock=self._loop.time)
        self.cache = LRUCache(config.cache_size, config.cache_max_bytes)
        self._in_flight: dict[CacheKey, asyncio.Future[list[Document]]] = {}
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def shared(cls, config: SearchToolConfig) -> RetrievalClient:
        """The client for ``config`` in the running event loop, created on first use."""
        loop = asyncio.get_running_loop()
        per_loop = cls._instances.setdefault(loop, {})
        client = per_loop.get(config)
        if client is None or client.closed:
            client = per_loop[config] = cls(config)
        return client

    @classmethod
    async def close_all(cls) -> None:
        """Close every client of the running loop."""
        for client in list(cls._instances.pop(asyncio.get_running_loop(), {}).values()):
            await client.close()

    @property
    def closed(self) -> bool:
        return self._session is not None and self._session.closed

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.config.num_workers, limit_per_host=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=json.dumps)
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def search(
        self, queries: Sequence[str], topk: int, *, deadline: float
    ) -> tuple[list[list[Document]], int, int]:
        """Hits per (normalised) query, how many came from the cache and how many joined a call in flight."""
        keys = [(q, topk) for q in queries]
        results: dict[CacheKey, list[Document]] = {}
        waits: dict[CacheKey, asyncio.Future[list[Document]]] = {}
        owned: dict[CacheKey, asyncio.Future[list[Document]]] = {}
        for key in dict.fromkeys(keys):
            cached = self.cache.get(key)
            if cached is not None:
                results[key] = cached
            elif key in self._in_flight:
                waits[key] = self._in_flight[key]
            else:
                fut = self._loop.create_future()
                self._in_flight[key] = owned[key] = fut
        hits = coalesced = 0
        if results or waits:
            hits = sum(1 for k in keys if k in results)
            coalesced = sum(1 for k in keys if k in waits)
            self.stats.add(cache_hits=hits, coalesced=coalesced)

        if owned:  # fetched in this task; _fetch resolves every owned future, also for twins that joined meanwhile
            await self._fetch(owned, topk, deadline)
            for key, fut in owned.items():
                results[key] = fut.result()
        if waits:
            remaining = deadline - self._loop.time()
            gathered = asyncio.gather(*(asyncio.shield(f) for f in waits.values()))
            try:
                values = await asyncio.wait_for(gathered, max(remaining, 0.0))
            except asyncio.TimeoutError as e:
                raise self._deadline_error() from e
            results.update(zip(waits, values, strict=True))
        return [results[k] for k in keys], hits, coalesced

    def _deadline_error(self, cause: Exception | None = None) -> DeadlineExceeded:
        detail = f" ({cause})" if cause is not None else ""
        return DeadlineExceeded(f"no answer within the {self.config.timeout:g} s deadline{detail}")

    async def _fetch(self, futures: dict[CacheKey, asyncio.Future], topk: int, deadline: float) -> None:
        """Request the owned keys; resolve each future with its hits or the error (never leaves one pending)."""
        keys = list(futures)
        try:
            hits = await self._request([q for q, _ in keys], topk, deadline)
        except BaseException as e:  # noqa: BLE001 - every waiter must learn the outcome
            err = e if isinstance(e, Exception) else DeadlineExceeded("search cancelled")
            for key, fut in futures.items():
                self._in_flight.pop(key, None)
                if not fut.done():
                    fut.set_exception(err)
                    fut.exception()  # mark retrieved: waiters that already gave up must not warn
            if not isinstance(e, Exception):
                raise
            return
        for key, docs in zip(keys, hits, strict=True):
            self.cache.put(key, docs)
            self._in_flight.pop(key, None)
            fut = futures[key]
            if not fut.done():
                fut.set_result(docs)

    async def _request(self, queries: list[str], topk: int, deadline: float) -> list[list[Document]]:
        attempt = 0
        while True:
            attempt += 1
            endpoint = self.endpoints.pick(self._loop.time())
            sent = self._loop.time()
            try:
                if self.limiter is not None:
                    await self.limiter.acquire(deadline)
                async with self.pool.slot(deadline):
                    sent = self._loop.time()
                    if deadline - sent <= 0:
                        raise self._deadline_error()
                    hits = await self._attempt(endpoint, queries, topk, deadline)
                self.endpoints.succeeded(endpoint)
                return hits
            except RetrievalError as e:
                if _endpoint_at_fault(e):
                    self.endpoints.failed(endpoint, self._loop.time(), started=sent)
                remaining = deadline - self._loop.time()
                if not e.retryable or attempt >= self.config.max_attempts or remaining <= 0:
                    if remaining <= 0 and e.retryable and not isinstance(e, DeadlineExceeded):
                        raise self._deadline_error(e) from e
                    raise
                cap = self.config.backoff_max  # a Retry-After is honoured up to the backoff cap
                asked = e.retry_after if isinstance(e, ServiceUnavailable) and e.retry_after else 0.0
                wait = backoff_seconds(attempt, self.config.backoff_base, cap, at_least=min(asked, cap))
                if wait >= remaining:
                    raise
                self.stats.add(retries=1)
                logger.debug("retrying search after %s (attempt %d, wait %.3fs)", e, attempt, wait)
                await asyncio.sleep(wait)

    async def _attempt(
        self, endpoint: Endpoint, queries: list[str], topk: int, deadline: float
    ) -> list[list[Document]]:
        """One attempt in the endpoint's wire form; in ``auto`` mode an endpoint of unknown form that rejects the
        batch form with a 4xx gets the single-query form once, and keeps it if that works."""
        wire = endpoint.wire if self.config.request_format == "auto" else self.config.request_format
        if wire == "skyrl":
            return await self._post_each(endpoint, queries, topk, deadline)
        try:
            body = await self._post(endpoint, batch_body(queries, topk), self._attempt_timeout(deadline))
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

    def _attempt_timeout(self, deadline: float) -> float:
        remaining = deadline - self._loop.time()
        if remaining <= 0:
            raise self._deadline_error()
        return min(remaining, self.config.attempt_timeout)

    async def _post_each(
        self, endpoint: Endpoint, queries: list[str], topk: int, deadline: float
    ) -> list[list[Document]]:
        """The single-query form: one concurrent request per query (within this attempt's worker slot)."""
        timeout = self._attempt_timeout(deadline)

        async def one(query: str) -> list[Document]:
            return parse_single(await self._post(endpoint, single_body(query, topk), timeout))

        tasks = [asyncio.ensure_future(one(q)) for q in queries]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _post(self, endpoint: Endpoint, payload: dict, timeout: float) -> Any:
        """POST ``payload``; the decoded JSON of a 200 reply, else the typed error for what happened."""
        session = self._get_session()
        self.stats.add(requests=1)
        endpoint.in_flight += 1
        try:
            async with session.post(endpoint.url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except asyncio.TimeoutError as e:
            raise DeadlineExceeded(f"{endpoint.url} did not answer within {timeout:.3g} s") from e
        except aiohttp.ClientConnectorError as e:
            raise ServiceUnavailable(f"cannot connect to {endpoint.url}: {e.os_error or e}") from e
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
            raise ServiceUnavailable(f"connection to {endpoint.url} dropped: {e}") from e
        except aiohttp.ClientError as e:
            raise ServiceUnavailable(f"request to {endpoint.url} failed: {e}") from e
        finally:
            endpoint.in_flight -= 1
        if status != 200:
            kind, detail = error_reply(raw)
            final = _FINAL_ERRORS.get(kind)
            if final is not None:  # the service says why, and retrying cannot change it
                raise final(f"{endpoint.url} answered {status}: {detail}")
            if status in (429, 503):
                raise ServiceUnavailable(
                    f"{endpoint.url} answered {status} ({detail})",
                    status=status,
                    retry_after=retry_after_seconds(retry_after),
                )
            if 400 <= status < 500:
                raise RequestRejected(f"{endpoint.url} rejected the request with {status}: {detail}")
            raise ServerError(f"{endpoint.url} answered {status}: {detail}")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadResponse(f"{endpoint.url} sent a reply that is not JSON") from e


def _endpoint_at_fault(e: RetrievalError) -> bool:
    """Timeouts, connection failures, 503 and 5xx eject the endpoint for a while; 429 (busy but alive) and 4xx don't."""
    if isinstance(e, ServiceUnavailable):
        return e.status != 429
    return isinstance(e, (DeadlineExceeded, ServerError))


#: error kinds of the service's JSON answer that end a call at once (a web search budget spent, a replay miss)
_FINAL_ERRORS: dict[str, type[RetrievalError]] = {"budget_exhausted": BudgetSpent, "not_cached": NotCached}
