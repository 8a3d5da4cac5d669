"""What bounds live web calls: the run's budget (a durable ledger of calls and spend per scope); the provider's rate is
one ``verl_search.pacing.TokenBucket`` shared by all calls of the process, and retries back off by ``pacing``.

A run is a budget scope (``--web_budget_scope``): its count lives in the cache file, so a server restarted mid-run
continues it, and servers sharing the file share it. Invariants: the ledger never passes a ceiling (a call is counted
before it is sent, atomically); a call the provider refused with an error status is taken back (not billed); backoff
arithmetic is bounded whatever the attempt number.
"""

from __future__ import annotations

from local_dense_retriever.web.cache import WebStore
from local_dense_retriever.web.errors import BudgetExhausted


class Budget:
    """The ceilings of one run on live calls and spend, kept in ``store``'s ledger under ``scope``."""

    def __init__(
        self, store: WebStore, scope: str, *, max_calls: int | None, max_spend: float | None, cost_per_call: float
    ) -> None:
        self.store, self.scope = store, scope
        self.max_calls, self.max_spend, self.cost = max_calls, max_spend, cost_per_call
        self.live_calls, self.spend = store.ledger(scope)  # the run so far (this process's view, for /metrics)
        self.refusals = 0

    def charge(self) -> None:
        """Count one live call, or raise ``BudgetExhausted`` when it would pass a ceiling."""
        granted, self.live_calls, self.spend = self.store.reserve(self.scope, self.cost, self.max_calls, self.max_spend)
        if not granted:
            self.refusals += 1
            raise BudgetExhausted(f"the web search budget of run {self.scope!r} is spent ({self.describe()})")

    def refund(self) -> None:
        """Take back the last charged call: the provider refused it with an error status."""
        self.live_calls, self.spend = self.store.refund(self.scope, self.cost)

    def describe(self) -> str:
        calls = f"{self.live_calls} live calls" + (f" of {self.max_calls}" if self.max_calls is not None else "")
        spend = f"${self.spend:.4g}" + (f" of ${self.max_spend:g}" if self.max_spend is not None else "")
        return f"{calls}, {spend} spent"
