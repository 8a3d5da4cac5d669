"""The per-process answer cache and the joining of identical calls in flight, shared by the search and access clients.

Invariants: the cache never holds more than its entry count nor its estimated bytes; a key in flight is fetched once
however many calls ask for it, every waiter learns its outcome, and a shared fetch is never cancelled because one of
its waiters gave up (each waits only until its own deadline).
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from verl_search.errors import DeadlineExceeded
from verl_search.protocol import Document
from verl_search.tool.stats import SearchStats

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: estimated bytes of the Python objects around one cache entry / one document, beyond their strings' characters
ENTRY_OVERHEAD = 200
_DOC_OVERHEAD = 400


def entry_bytes(key: tuple[str, int], docs: list[Document]) -> int:
    """An estimate of the memory one search entry holds: its strings' sizes plus a fixed overhead per object."""
    total = ENTRY_OVERHEAD + sys.getsizeof(key[0])
    for doc in docs:
        total += _DOC_OVERHEAD + sys.getsizeof(doc.id) + sys.getsizeof(doc.contents)
        for value in (doc.model_extra or {}).values():
            total += sys.getsizeof(value) if isinstance(value, str) else 64
    return total


class LRUCache(Generic[K, V]):
    """key → value: never more than ``size`` entries nor ``max_bytes`` of memory as ``weigh`` estimates it (a larger
    entry is not stored; either bound at 0 turns it off); least recently used out first."""

    def __init__(
        self, size: int, max_bytes: int | None = None, *, weigh: Callable[[Any, Any], int] = entry_bytes
    ) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        self._weigh = weigh
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V) -> None:
        if self.size <= 0 or self.max_bytes == 0:
            return
        cost = self._weigh(key, value)
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


class CachedCalls(Generic[K, V]):
    """Answers for keys: from ``cache``, by joining a fetch of the same key in flight, else fetched (the missing keys
    of one call together); ``keep(value)`` says whether an answer is cached (all are, by default)."""

    def __init__(
        self, cache: LRUCache[K, V], stats: SearchStats, *, keep: Callable[[V], bool] = lambda value: True
    ) -> None:
        self.cache = cache
        self.stats = stats
        self._keep = keep
        self._loop = asyncio.get_running_loop()
        self._in_flight: dict[K, asyncio.Future[V]] = {}

    async def get(
        self,
        keys: Sequence[K],
        fetch: Callable[[list[K]], Awaitable[list[V]]],
        *,
        deadline: float,
        late: Callable[[], Exception],
    ) -> tuple[list[V], int, int]:
        """The value per key, how many came from the cache and how many joined a fetch in flight; ``fetch(keys)``
        returns one value per key it is given; ``late()`` is the error of a joined fetch outlasting ``deadline``."""
        results: dict[K, V] = {}
        waits: dict[K, asyncio.Future[V]] = {}
        owned: dict[K, asyncio.Future[V]] = {}
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
            await self._fetch(owned, fetch)
            for key, fut in owned.items():
                results[key] = fut.result()
        if waits:
            remaining = deadline - self._loop.time()
            gathered = asyncio.gather(*(asyncio.shield(f) for f in waits.values()))
            try:
                values = await asyncio.wait_for(gathered, max(remaining, 0.0))
            except asyncio.TimeoutError as e:
                raise late() from e
            results.update(zip(waits, values, strict=True))
        return [results[k] for k in keys], hits, coalesced

    async def _fetch(self, futures: dict[K, asyncio.Future[V]], fetch: Callable[[list[K]], Awaitable[list[V]]]) -> None:
        """Fetch the owned keys; resolve each future with its value or the error (never leaves one pending)."""
        keys = list(futures)
        try:
            values = await fetch(keys)
        except BaseException as e:  # noqa: BLE001 - every waiter must learn the outcome
            err = e if isinstance(e, Exception) else DeadlineExceeded("the call that fetched it was cancelled")
            for key, fut in futures.items():
                self._in_flight.pop(key, None)
                if not fut.done():
                    fut.set_exception(err)
                    fut.exception()  # mark retrieved: waiters that already gave up must not warn
            if not isinstance(e, Exception):
                raise
            return
        for key, value in zip(keys, values, strict=True):
            if self._keep(value):
                self.cache.put(key, value)
            self._in_flight.pop(key, None)
            fut = futures[key]
            if not fut.done():
                fut.set_result(value)
