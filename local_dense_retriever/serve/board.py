"""``FleetBoard``: where every retriever replica and gateway of the fleet posts its state about once a second, so the
gateway answers /health and /metrics for the whole fleet (Serve routes each call to one replica; none can ask all).

Invariants: a report older than ``ttl_s`` is forgotten (a dead replica leaves the board within that time; its
replacement appears with its first report); posting never blocks or fails the poster's own work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: how often each replica and gateway posts its report, and how long the board keeps one
REPORT_PERIOD_S = 1.0
REPORT_TTL_S = 5.0


class FleetBoard:
    """The last report of each replica and gateway (a Serve deployment of one replica, called through handles)."""

    def __init__(self, ttl_s: float = REPORT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._reports: dict[tuple[str, str], tuple[float, dict]] = {}

    def post(self, kind: str, name: str, report: dict) -> None:
        self._reports[(kind, name)] = (time.monotonic(), report)

    def read(self) -> dict[str, dict[str, dict]]:
        """``{kind: {name: report + age_s}}`` for the reports younger than ``ttl_s`` (kinds: retriever, gateway)."""
        now = time.monotonic()
        out: dict[str, dict[str, dict]] = {"retriever": {}, "gateway": {}}
        for key, (at, report) in list(self._reports.items()):
            if now - at > self.ttl_s:
                del self._reports[key]
                continue
            kind, name = key
            out.setdefault(kind, {})[name] = {**report, "age_s": now - at}
        return out


async def post_forever(board: Any, kind: str, name: str, report: Callable[[], dict | None],
                       period_s: float = REPORT_PERIOD_S) -> None:  # fmt: skip
    """Post ``report()`` (skipped while it is None) to ``board`` (a handle to FleetBoard) every ``period_s``."""
    failing = False
    while True:
        try:
            body = report()
            if body is not None:
                await board.post.remote(kind, name, body)
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a board being replaced must not stop the replica's reports for good
            if not failing:
                logger.warning("fleet board: %s %s could not post its report (will keep trying)", kind, name,
                               exc_info=True)  # fmt: skip
            failing = True
        await asyncio.sleep(period_s)
