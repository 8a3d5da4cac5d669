"""The validation subset choice: stratified, capped per source, independent of input order and nested in N."""

from __future__ import annotations

import random

import pytest

from verl_search.data.pipeline import stratified_subsample

ITEMS = [(source, f"{source}-{i}") for source, n in (("nq", 50), ("popqa", 30), ("bamboogle", 3)) for i in range(n)]


def pick(items, n, seed=0):
    return stratified_subsample(items, n, seed, source_of=lambda it: it[0], key_of=lambda it: it[1])


def test_caps_each_source_and_keeps_small_ones_whole():
    chosen = pick(ITEMS, 10)
    assert {s: sum(1 for c in chosen if c[0] == s) for s in ("nq", "popqa", "bamboogle")} == {
        "nq": 10, "popqa": 10, "bamboogle": 3}  # fmt: skip
    assert chosen == [it for it in ITEMS if it in chosen]  # input order kept


def test_independent_of_input_order():
    shuffled = ITEMS[:]
    random.Random(1).shuffle(shuffled)
    assert set(pick(shuffled, 10)) == set(pick(ITEMS, 10))


def test_larger_n_extends_smaller_n():
    assert set(pick(ITEMS, 5)) <= set(pick(ITEMS, 20))


def test_seed_changes_the_choice():
    assert set(pick(ITEMS, 10, seed=0)) != set(pick(ITEMS, 10, seed=1))


def test_non_positive_n_is_refused():
    with pytest.raises(ValueError, match="per_source must be >= 1"):
        pick(ITEMS, 0)
