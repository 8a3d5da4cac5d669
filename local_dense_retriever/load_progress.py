"""LoadProgress: how far one loading stage has got, as log lines, so a start-up that takes minutes is never silent.
Invariant: a line at most every ``every_s`` seconds (each count when it is 0), from the thread that reads."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, as nvidia-smi and torch count GPU memory: ``812 MiB``, ``1.5 MiB``, ``61.3 GiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f} {unit}" if shift >= 30 or value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


class LoadProgress:
    """Counts what a stage has read (bytes, or rows with ``unit='rows'``) out of what it expects, and logs it."""

    def __init__(self, what: str, *, every_s: float = 5.0, unit: str = "bytes", log: logging.Logger = logger):
        if unit not in ("bytes", "rows"):
            raise ValueError(f"unit must be 'bytes' or 'rows', not {unit!r}")
        self.what, self.every_s, self.unit, self.log = what, every_s, unit, log
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self._last = self.started

    def expect(self, amount: int) -> None:
        """What a reader is about to read (several readers of one stage add theirs)."""
        self.total += amount

    def add(self, amount: int) -> None:
        """``amount`` more read; logs the count when the last line is ``every_s`` old."""
        self.done += amount
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.log.info("%s", self.line(now))

    def _count(self, n: int) -> str:
        return format_bytes(n) if self.unit == "bytes" else f"{n:,} rows"

    def line(self, now: float | None = None) -> str:
        """``loading WHAT: DONE of TOTAL (P%), S s`` (without a total: ``loading WHAT: DONE, S s``)."""
        elapsed = (now if now is not None else time.monotonic()) - self.started
        if self.total <= 0:
            return f"loading {self.what}: {self._count(self.done)}, {elapsed:.0f} s"
        if self.unit == "bytes":  # one unit for both figures: '12.0 of 61.3 GiB'
            whole, unit = format_bytes(self.total).split(" ")
            digits = 1 if "." in whole else 0
            done = f"{self.done / self.total * float(whole):.{digits}f}"
            counted = f"{done} of {whole} {unit}"
        else:
            counted = f"{self.done:,} of {self.total:,} rows"
        return f"loading {self.what}: {counted} ({100 * self.done / self.total:.0f}%), {elapsed:.0f} s"
