"""How the step metrics read a trajectory's values: a finite number or nothing, a list or nothing (never an error,
whatever a row holds)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def number(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (missing, text, NaN, infinity)."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def numbers(rows: list[Mapping[str, Any]], key: str) -> list[float]:
    """The finite numbers the rows hold under ``key`` (rows without one are left out)."""
    return [v for r in rows if (v := number(r.get(key))) is not None]


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else []


def nearest_rank(values: list[float], q: float) -> float:
    """The ``q``-th percentile of non-empty ``values`` by the nearest-rank method (always one of the values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
