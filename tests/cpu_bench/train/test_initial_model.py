"""The initial model's tokenizer is learnt on other toy worlds, like a real base model's tokenizer on text that
predates the evaluated world: the evaluated world's names then come out as pieces the other worlds use too (which the
base-model stage trains), not as whole-name tokens nothing but the evaluated world uses."""

from __future__ import annotations

from collections import Counter

import pytest

from cpu_bench.train.initial_model import build_tokenizer, tokenizer_texts
from cpu_bench.train.questions import all_questions
from local_dense_retriever.toy.world import ToyWorld
from verl_search.data.rows import shown_question
from verl_search.data.templates import load_templates
from verl_search.resources import PROMPT_YAML, shipped_file

PASSAGES = 300


@pytest.fixture(scope="module")
def templates():
    loaded = load_templates(shipped_file(PROMPT_YAML))
    return [loaded.get("search_r1")[1], loaded.get("tool_call")[1]]


def _unseen_share(tokenizer, names: list[str], texts: list[str]) -> float:
    """Share of the token uses of ``names`` whose token never occurs in ``texts``."""
    seen = Counter(t for text in texts for t in tokenizer.encode(text, add_special_tokens=False))
    uses = [t for name in names for t in tokenizer.encode(" " + name, add_special_tokens=False)]
    return sum(1 for t in uses if not seen[t]) / len(uses)


def test_texts_hold_other_worlds_passages_and_prompts_but_nothing_of_the_evaluated_world(templates, tmp_path):
    texts = tokenizer_texts([1, 2], PASSAGES, templates, tmp_path)
    joined = "\n".join(texts)
    assert ToyWorld(PASSAGES, 1).name[0] in joined and ToyWorld(PASSAGES, 2).name[0] in joined
    asked = shown_question(all_questions(ToyWorld(PASSAGES, 1))[0]["question"])
    assert asked in joined and templates[0].render(asked)[-1]["content"] in texts  # the rendered prompts are there
    evaluated = ToyWorld(PASSAGES, 0).word
    assert sum(word in joined for word in evaluated) < len(evaluated) / 50  # a rare clash of random syllables at most


def test_evaluated_names_are_made_of_pieces_the_other_worlds_use(templates, tmp_path):
    other = tokenizer_texts([1, 2], PASSAGES, templates, tmp_path)
    evaluated = tokenizer_texts([0], PASSAGES, templates, tmp_path)
    names = ToyWorld(PASSAGES, 0).name
    from_other = build_tokenizer(other, 2048)
    from_evaluated = build_tokenizer(evaluated, 2048)
    # learnt on the evaluated world, its names take tokens no other world's text contains (untrained at SFT)
    assert _unseen_share(from_evaluated, names, other) > 0.05
    assert _unseen_share(from_other, names, other) < 0.03
