"""Other worlds' search trajectories: formatted as the tool formats a result, faithful (the bridge and the answer are
in what each search returned), and about a world other than the evaluated one."""

from __future__ import annotations

import pytest

from cpu_bench.train.other_worlds import oracle_trajectories
from cpu_bench.train.questions import all_questions
from local_dense_retriever.toy.world import ToyWorld
from verl_search.data.rows import shown_question


@pytest.fixture(scope="module")
def world1(tmp_path_factory):
    return list(oracle_trajectories(1, 200, 300, tmp_path_factory.mktemp("worlds")))


def test_every_trajectory_follows_the_rule_of_the_sft_trajectories(world1):
    assert len(world1) > 100 and {t.hops for t in world1} == {1, 2}
    for t in world1:
        queries = [q for q, _ in t.searches]
        assert queries[0] == t.question and len(queries) == t.hops
        for _query, result in t.searches:
            assert result.startswith("Doc 1(Title: ") and len(result) <= 300
        if t.hops == 2:
            assert queries[1].lower() in t.searches[0][1].lower()  # the bridge was named in the first result
            assert t.searches[1][1].startswith(f'Doc 1(Title: "{queries[1]}")')  # and its passage came back
        assert t.answer in t.golden_answers and t.answer.lower() in t.searches[-1][1].lower()


def test_the_trajectories_are_about_another_world(world1):
    evaluated = {shown_question(q["question"]) for q in all_questions(ToyWorld(200, 0))}
    names = set(ToyWorld(200, 0).name)
    assert not {t.question for t in world1} & evaluated
    bridges = {t.searches[1][0] for t in world1 if t.hops == 2}
    assert len(bridges & names) < len(bridges) / 10  # an occasional name clash of random syllables at most


def test_the_same_seed_gives_the_same_trajectories(world1, tmp_path):
    assert list(oracle_trajectories(1, 200, 300, tmp_path))[:20] == world1[:20]
