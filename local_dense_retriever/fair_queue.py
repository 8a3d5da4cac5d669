"""The batcher's waiting room: requests in round-robin order and the count of their queries not yet handed out.
Invariant: ``queued`` is the sum of ``remaining`` over the queued requests, written by this class alone;
``take`` discards requests whose future is done itself, so it returns no slice only when nothing is queued."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Request:
    """One ``submit`` call: its queries, how far they have been handed out, and the future its caller awaits."""

    queries: list[str]
    k: int
    future: asyncio.Future
    costs: list[int]
    results: list = field(default_factory=list)
    next: int = 0  # first query not yet handed to a micro-batch (written only by FairQueue)
    answered: int = 0
    in_queue: bool = False  # held in FairQueue's deque (written only by FairQueue)

    @property
    def remaining(self) -> int:
        return len(self.queries) - self.next


@dataclass
class Slice:
    """Queries ``lo:hi`` of one request inside a micro-batch."""

    req: Request
    lo: int
    hi: int


class FairQueue:
    """Round-robin queue: a micro-batch takes one query at a time from each waiting request in turn."""

    def __init__(self) -> None:
        self._deque: collections.deque[Request] = collections.deque()
        self._queued = 0  # sum of remaining over the deque
        self._dead = 0  # requests in the deque with remaining == 0 (skipped when reached, compacted in bulk)

    @property
    def queued(self) -> int:
        """Queries waiting to be handed to a micro-batch."""
        return self._queued

    def push(self, req: Request) -> None:
        if req.in_queue or not req.remaining:
            raise ValueError("a request is queued once, with queries left")
        req.in_queue = True
        self._deque.append(req)
        self._queued += req.remaining

    def discard(self, req: Request) -> None:
        """Forget the queries ``req`` still had waiting (its caller went away, or it is resolved). Idempotent."""
        left = req.remaining
        if not left:
            return
        req.next = len(req.queries)
        self._queued -= left
        if req.in_queue:
            self._dead += 1
            if self._dead > max(64, len(self._deque) // 2):  # compact before the dead outnumber the living
                self._compact()

    def _compact(self) -> None:
        live: collections.deque[Request] = collections.deque()
        for r in self._deque:
            if r.remaining:
                live.append(r)
            else:
                r.in_queue = False
        self._deque = live
        self._dead = 0

    def take(self, max_size: int, max_tokens: int | None) -> list[Slice]:
        """The next micro-batch: up to ``max_size`` queries and about ``max_tokens`` tokens, round-robin."""
        slices: dict[Request, Slice] = {}
        size = tokens = 0
        while self._deque and size < max_size:
            req = self._deque.popleft()
            req.in_queue = False
            if not req.remaining:
                self._dead -= 1
                continue
            if req.future.done():  # its caller went away or it failed: its done-callback has not run yet
                self.discard(req)
                continue
            cost = req.costs[req.next]
            if size and max_tokens is not None and tokens + cost > max_tokens:
                req.in_queue = True
                self._deque.appendleft(req)
                break
            part = slices.get(req)
            if part is None:
                slices[req] = Slice(req, req.next, req.next + 1)
            else:
                part.hi += 1
            req.next += 1
            self._queued -= 1
            size += 1
            tokens += cost
            if req.remaining:  # round-robin: its next query waits for the other requests' turn
                req.in_queue = True
                self._deque.append(req)
        return list(slices.values())

    def clear(self, resolve: Callable[[Request], None]) -> None:
        """Empty the queue, calling ``resolve`` on every request that still had queries waiting."""
        while self._deque:
            req = self._deque.popleft()
            req.in_queue = False
            if req.remaining:
                self.discard(req)
                resolve(req)
        self._queued = self._dead = 0

    def resync(self) -> None:
        """Re-derive both counts from the deque (the batcher's last resort)."""
        self._queued = sum(r.remaining for r in self._deque)
        self._dead = sum(1 for r in self._deque if not r.remaining)

    def state(self) -> dict:
        """The counts and what the deque holds, for logs."""
        return {
            "queued": self._queued,
            "dead": self._dead,
            "requests_in_queue": len(self._deque),
            "queries_in_queue": sum(r.remaining for r in self._deque),
            "done_futures_in_queue": sum(1 for r in self._deque if r.future.done()),
        }
