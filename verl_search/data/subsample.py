"""Stratified, seeded validation subset: at most N rows per data source, chosen by a stable hash of (seed, source, key).

Invariant: the choice depends only on (seed, source, key) -- not on Python/numpy versions or input order -- so the
same input and seed always give the same subset, and the subset for N is contained in the subset for any M > N.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def _rank(seed: int, source: str, key: str) -> bytes:
    return hashlib.sha256(f"{seed}\x00{source}\x00{key}".encode()).digest()


def stratified_subsample(
    items: Sequence[T], per_source: int, seed: int, source_of: Callable[[T], str], key_of: Callable[[T], str]
) -> list[T]:
    """Keep at most ``per_source`` items of each source (all of a smaller source), in their original order."""
    if per_source < 1:
        raise ValueError(f"per_source must be >= 1, got {per_source}")
    by_source: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        by_source.setdefault(source_of(item), []).append(position)
    keep: set[int] = set()
    for source, positions in by_source.items():
        ranked = sorted(positions, key=lambda p: (_rank(seed, source, key_of(items[p])), p))
        keep.update(ranked[:per_source])
    return [item for position, item in enumerate(items) if position in keep]
