"""The SFT rows that answer without searching (``search.no_search_share``): their share of all SFT rows, one per
question at most, drawn by the split seed, and rendered as an answer with no search turn in both protocols."""

from __future__ import annotations

import pytest

from verl_search.train.data_stage import direct_answers
from verl_search.train.sft_data import Trajectory, model_turns


def _answer_only(n: int) -> list[Trajectory]:
    return [Trajectory(f"question {i}?", (f"gold {i}",), 1 + i % 2, f"gold {i}", ()) for i in range(n)]


@pytest.mark.parametrize("share", [0.2, 0.4, 0.5])
def test_direct_rows_are_the_asked_share_of_all_rows(share):
    direct = direct_answers(_answer_only(1000), 900, share, seed=0)
    assert len(direct) / (len(direct) + 900) == pytest.approx(share, abs=0.002)
    assert len({t.question for t in direct}) == len(direct)  # one per question


def test_no_share_gives_no_rows_and_the_seed_decides_which_questions():
    assert direct_answers(_answer_only(100), 90, 0.0, seed=0) == []
    a, b = (direct_answers(_answer_only(100), 90, 0.3, seed=s) for s in (0, 1))
    assert a == direct_answers(_answer_only(100), 90, 0.3, seed=0) and a != b


def test_the_share_is_capped_by_the_questions_there_are():
    assert len(direct_answers(_answer_only(10), 90, 0.5, seed=0)) == 10


def test_a_direct_row_answers_at_once_with_no_search_turn():
    (turn,) = model_turns(_answer_only(1)[0], "native")
    assert turn.text == "<answer> gold 0 </answer>" and turn.query is None
