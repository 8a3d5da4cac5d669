"""The SFT questions answered without searching (``search.no_search_share``): their share, drawn by the split seed,
disjoint from the searched ones, and rendered as an answer with no search turn."""

from __future__ import annotations

import pytest

from cpu_bench.train.data_stage import directly_answered
from cpu_bench.train.sft_data import Trajectory, model_turns


@pytest.mark.parametrize("share", [0.0, 0.25, 0.6])
def test_the_asked_share_of_questions_is_answered_directly(share):
    direct = directly_answered(1000, share, seed=0)
    assert len(direct) == round(1000 * share) and direct <= set(range(1000))


def test_the_seed_decides_which_questions():
    a, b = (directly_answered(100, 0.3, seed=s) for s in (0, 1))
    assert a == directly_answered(100, 0.3, seed=0) and a != b


def test_a_direct_row_answers_at_once_with_no_search_turn():
    (turn,) = model_turns(Trajectory("question?", ("gold",), 1, "gold", ()), "native")
    assert turn.text == "<answer> gold </answer>" and turn.query is None
