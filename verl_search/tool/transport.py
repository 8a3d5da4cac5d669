"""Transport: how one logical request reaches a set of retrieval-service endpoints. One aiohttp session, worker pool,
rate limiter and endpoint set per client; ``call`` runs an attempt under the call's deadline with retries, backoff and
failover, ``post`` sends one JSON body and types whatever goes wrong. Both the search and the access client use it.

Invariants: no call outlives its deadline; only timeouts, connection errors, 429 and 503 are retried; every failure is
a typed :class:`RetrievalError`; endpoints at fault (timeouts, connection failures, 503, 5xx) are ejected for a while.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, ClassVar, Self, TypeVar

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
from verl_search.tool.config import ClientConfig
from verl_search.tool.limits import Endpoint, EndpointSet, WorkerPool
from verl_search.tool.stats import SearchStats
from verl_search.tool.wire import error_reply

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Transport:
    """Pool, rate limit, deadline, retries and endpoint failover over ``urls``, configured by ``config``; made inside
    the running event loop (its session belongs to it)."""

    def __init__(self, urls: Sequence[str], config: ClientConfig, stats: SearchStats) -> None:
        self.config = config
        self.stats = stats
        self.loop = asyncio.get_running_loop()
        self.endpoints = EndpointSet(
            urls, eject_seconds=config.eject_seconds, eject_max_seconds=config.eject_max_seconds
        )
        self.pool = WorkerPool(config.num_workers, clock=self.loop.time)
        self.limiter = None
        if config.rate_limit:
            self.limiter = TokenBucket(config.rate_limit, late=DeadlineExceeded, clock=self.loop.time)
        self._session: aiohttp.ClientSession | None = None

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

    def deadline_error(self, cause: Exception | None = None) -> DeadlineExceeded:
        detail = f" ({cause})" if cause is not None else ""
        return DeadlineExceeded(f"no answer within the {self.config.timeout:g} s deadline{detail}")

    def attempt_timeout(self, deadline: float) -> float:
        """Seconds one HTTP attempt may take now: ``attempt_timeout``, capped by what is left of the deadline."""
        remaining = deadline - self.loop.time()
        if remaining <= 0:
            raise self.deadline_error()
        return min(remaining, self.config.attempt_timeout)

    async def call(self, attempt: Callable[[Endpoint], Awaitable[T]], deadline: float) -> T:
        """``attempt(endpoint)`` on a picked endpoint, in a worker slot after a rate-limit token, retried (on another
        endpoint when this one is ejected) while the error is retryable, attempts remain and the deadline allows."""
        n = 0
        while True:
            n += 1
            endpoint = self.endpoints.pick(self.loop.time())
            sent = self.loop.time()
            try:
                if self.limiter is not None:
                    await self.limiter.acquire(deadline)
                async with self.pool.slot(deadline):
                    sent = self.loop.time()
                    if deadline - sent <= 0:
                        raise self.deadline_error()
                    result = await attempt(endpoint)
                self.endpoints.succeeded(endpoint)
                return result
            except RetrievalError as e:
                if _endpoint_at_fault(e):
                    self.endpoints.failed(endpoint, self.loop.time(), started=sent)
                remaining = deadline - self.loop.time()
                if not e.retryable or n >= self.config.max_attempts or remaining <= 0:
                    if remaining <= 0 and e.retryable and not isinstance(e, DeadlineExceeded):
                        raise self.deadline_error(e) from e
                    raise
                cap = self.config.backoff_max  # a Retry-After is honoured up to the backoff cap
                asked = e.retry_after if isinstance(e, ServiceUnavailable) and e.retry_after else 0.0
                wait = backoff_seconds(n, self.config.backoff_base, cap, at_least=min(asked, cap))
                if wait >= remaining:
                    raise
                self.stats.add(retries=1)
                logger.debug("retrying %s after %s (attempt %d, wait %.3fs)", endpoint.url, e, n, wait)
                await asyncio.sleep(wait)

    async def post(self, endpoint: Endpoint, payload: dict, timeout: float) -> Any:
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


class SharedClient:
    """Base of the tool clients: one per class, config and event loop (``shared``), each over its own
    :class:`Transport`; ``close_all`` closes every client of the running loop, of whatever class."""

    _instances: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[type, Hashable], Any]]] = (
        weakref.WeakKeyDictionary()
    )
    transport: Transport

    @classmethod
    def shared(cls, config: Hashable) -> Self:
        """The client for ``config`` in the running event loop, created on first use."""
        per_loop = SharedClient._instances.setdefault(asyncio.get_running_loop(), {})
        client = per_loop.get((cls, config))
        if client is None or client.closed:
            client = per_loop[(cls, config)] = cls(config)
        return client

    @classmethod
    async def close_all(cls) -> None:
        """Close every client of the running loop."""
        for client in list(SharedClient._instances.pop(asyncio.get_running_loop(), {}).values()):
            await client.close()

    @property
    def endpoints(self) -> EndpointSet:
        return self.transport.endpoints

    @property
    def pool(self) -> WorkerPool:
        return self.transport.pool

    @property
    def limiter(self) -> TokenBucket | None:
        return self.transport.limiter

    @property
    def closed(self) -> bool:
        return self.transport.closed

    async def close(self) -> None:
        await self.transport.close()


def _endpoint_at_fault(e: RetrievalError) -> bool:
    """Timeouts, connection failures, 503 and 5xx eject the endpoint for a while; 429 (busy but alive) and 4xx don't."""
    if isinstance(e, ServiceUnavailable):
        return e.status != 429
    return isinstance(e, (DeadlineExceeded, ServerError))


#: error kinds of the service's JSON answer that end a call at once (a web search budget spent, a replay miss)
_FINAL_ERRORS: dict[str, type[RetrievalError]] = {"budget_exhausted": BudgetSpent, "not_cached": NotCached}
