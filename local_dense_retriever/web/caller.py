"""LiveCaller: one query's call to the provider, with the run's budget, the shared rate limit, bounded retries with
backoff and a deadline. Invariants: the budget is charged before a rate slot is waited for (and taken back when none
comes); no call outlives ``timeout_s``; only 429, 5xx, timeouts and dropped connections are retried; at most
``MAX_REPLY_BYTES`` of a reply are read; every failure is an ``UpstreamError``, ``RateLimited`` or
``BudgetExhausted`` whose text is ours: it names the provider, the HTTP status and what failed, never the provider's
text, the key or a URL (transport errors are described by kind, not by aiohttp's message, which names the URL). The
provider's text reaches only the log, through ``Redactor`` (the key masked in every encoding, then cut)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from pydantic import SecretStr

from local_dense_retriever.web.errors import UpstreamError
from local_dense_retriever.web.limits import Budget
from local_dense_retriever.web.providers import Provider, ProviderFailure, WebHit
from local_dense_retriever.web.redact import Redactor
from verl_search.pacing import TokenBucket, backoff_seconds, retry_after_seconds

logger = logging.getLogger(__name__)

#: most bytes of one reply read; a longer one fails its query (a hundred hits take well under 1 MiB)
MAX_REPLY_BYTES = 8 << 20


class LiveCaller:
    """Calls ``provider`` at ``base_url``; lives on one event loop (its HTTP session is made there on first use)."""

    def __init__(
        self,
        provider: Provider,
        base_url: str,
        key: SecretStr,
        *,
        budget: Budget,
        bucket: TokenBucket,
        timeout_s: float,
        max_attempts: int,
        backoff_base: float = 0.25,
        backoff_max: float = 4.0,
    ) -> None:
        self.provider, self.base_url, self._key = provider, base_url, key
        self.budget, self.bucket = budget, bucket
        self.timeout_s, self.max_attempts = timeout_s, max_attempts
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.requests_sent = 0  # HTTP requests made by this process (retries included)
        self.failures = 0  # calls that ended in UpstreamError
        self._session: aiohttp.ClientSession | None = None
        self._redactor = Redactor(key.get_secret_value())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, query: str, k: int) -> list[WebHit]:
        """The provider's top ``k`` for ``query``; raises ``UpstreamError``, ``RateLimited`` or ``BudgetExhausted``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        attempt, last = 0, None
        while attempt < self.max_attempts:
            attempt += 1
            self.budget.charge()  # a spent budget is refused at once, before any wait for a rate slot
            try:
                await self.bucket.acquire(deadline)
            except BaseException:
                self.budget.refund()
                raise
            try:
                return await self._send(query, k, deadline)
            except ProviderFailure as e:
                if not e.sent or (e.status is not None and e.status != 200):  # never sent, or refused: not billed
                    self.budget.refund()
                last = e
                if e.said:
                    logger.info("%s: attempt %d: %s; it said: %s", self.provider.name, attempt, e,
                                self._redactor.clean(e.said))  # fmt: skip
                if not e.retryable:
                    break
                retry_after = e.retry_after
            delay = backoff_seconds(attempt, self.backoff_base, self.backoff_max, at_least=retry_after)
            if attempt >= self.max_attempts or loop.time() + delay >= deadline:
                break
            logger.debug("%s: attempt %d failed (%s); retrying in %.3g s", self.provider.name, attempt, last, delay)
            await asyncio.sleep(delay)
        self.failures += 1
        assert last is not None
        status = f"HTTP {last.status}" if last.status is not None else "no HTTP reply"
        raise UpstreamError(f"upstream_error: {last} ({status}, after {attempt} attempt{'s' * (attempt > 1)})")

    async def _send(self, query: str, k: int, deadline: float) -> list[WebHit]:
        loop, name = asyncio.get_running_loop(), self.provider.name
        timeout = deadline - loop.time()
        if timeout <= 0:
            raise ProviderFailure(f"{name}: no time left within {self.timeout_s:g} s", status=None, retryable=False,
                                  sent=False)  # fmt: skip
        req = self.provider.request(self.base_url, query, k, self._key.get_secret_value())
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self.requests_sent += 1
        try:
            async with self._session.request(
                req.method, req.url, params=req.params, headers=req.headers, json=req.json,
                timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False,
            ) as resp:  # fmt: skip
                status, retry_after = resp.status, retry_after_seconds(resp.headers.get("Retry-After"))
                raw = await _read_body(resp, name)
        except asyncio.TimeoutError:
            raise ProviderFailure(
                f"{name} did not answer within {timeout:.3g} s", status=None, retryable=True
            ) from None
        except aiohttp.ClientConnectorError:
            raise ProviderFailure(f"cannot connect to {name}", status=None, retryable=True, sent=False) from None
        except aiohttp.ClientError as e:
            raise ProviderFailure(f"{name} dropped the connection ({type(e).__name__})", status=None,
                                  retryable=True) from None  # fmt: skip
        try:  # a large reply is parsed off the loop, which answers cache hits meanwhile
            return await asyncio.to_thread(self.provider.parse, status, raw, k, retry_after)
        except ProviderFailure:
            raise
        except Exception as e:  # our reader failed on this reply: that query fails, never its batch
            logger.error("%s: reading a reply of HTTP %d failed: %s", name, status, type(e).__name__)
            raise ProviderFailure(f"{name} sent a reply that could not be read", status=status,
                                  retryable=False) from None  # fmt: skip


async def _read_body(resp: aiohttp.ClientResponse, name: str) -> bytes:
    """The body of ``resp``; ``ProviderFailure`` (the rest unread) when it is longer than ``MAX_REPLY_BYTES``."""
    body = bytearray()
    if (resp.content_length or 0) <= MAX_REPLY_BYTES:
        async for chunk in resp.content.iter_chunked(64 << 10):
            body += chunk
            if len(body) > MAX_REPLY_BYTES:
                break
    if len(body) > MAX_REPLY_BYTES or (resp.content_length or 0) > MAX_REPLY_BYTES:
        raise ProviderFailure(f"{name} sent a reply larger than {MAX_REPLY_BYTES >> 20} MiB", status=resp.status,
                              retryable=False)  # fmt: skip
    return bytes(body)
