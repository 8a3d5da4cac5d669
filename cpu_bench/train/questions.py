"""The toy world's questions split by seed into SFT, RL and evaluation sets.

Invariant: the three sets are disjoint (no question text in two of them), each is half single-hop and half two-hop
(as far as the world allows), and the split is a pure function of (world size, world seed, sizes, split seed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from local_dense_retriever.toy.questions import generate_questions, max_questions
from local_dense_retriever.toy.world import ToyWorld

SPLITS = ("sft", "rl", "eval")


@dataclass(frozen=True)
class SplitSizes:
    """How many questions go to each split (each half single-hop, half two-hop) and the seed that chooses them."""

    sft: int = 3000
    rl: int = 1000
    eval: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in SPLITS:
            if getattr(self, name) < 2:
                raise ValueError(f"split {name!r} needs at least 2 questions, got {getattr(self, name)}")


def all_questions(world: ToyWorld) -> list[dict]:
    """Every distinct question the world can ask (FlashRAG rows with ``metadata.hops`` and ``supporting_ids``)."""
    rows = list(generate_questions(world, max_questions(world)))
    unique: dict[str, dict] = {}
    for row in rows:
        unique.setdefault(row["question"], row)
    return list(unique.values())


def split_questions(world: ToyWorld, sizes: SplitSizes) -> dict[str, list[dict]]:
    """``{"sft": [...], "rl": [...], "eval": [...]}``; eval is drawn first, so growing sft or rl never changes it."""
    by_hops: dict[int, list[dict]] = {1: [], 2: []}
    for row in all_questions(world):
        by_hops[int(row["metadata"]["hops"])].append(row)
    rng = np.random.default_rng([sizes.seed, 0x5E11])
    pools = {hops: [rows[i] for i in rng.permutation(len(rows))] for hops, rows in by_hops.items()}
    total = sum(getattr(sizes, name) for name in SPLITS)
    if total > sum(len(p) for p in pools.values()):
        raise ValueError(f"the world has {sum(len(p) for p in pools.values())} questions; the splits ask for {total}")
    taken = dict.fromkeys(pools, 0)
    out: dict[str, list[dict]] = {}
    for name in ("eval", "rl", "sft"):
        want = getattr(sizes, name)
        rows: list[dict] = []
        for hops in (1, 2):
            share = want // 2 if hops == 1 else want - want // 2
            share = min(share, len(pools[hops]) - taken[hops])
            rows += pools[hops][taken[hops] : taken[hops] + share]
            taken[hops] += share
        if len(rows) < want:  # one hop group ran out: fill from the other
            other = 2 if len(pools[1]) - taken[1] == 0 else 1
            extra = want - len(rows)
            rows += pools[other][taken[other] : taken[other] + extra]
            taken[other] += extra
        order = np.random.default_rng([sizes.seed, len(out)]).permutation(len(rows))
        out[name] = [rows[i] for i in order]
    return {name: out[name] for name in SPLITS}
