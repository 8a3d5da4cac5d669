"""The reward on ASearcher-style responses: <access> is the model's structure like <search>, and the pages' text
(inside <information>) never counts."""

from __future__ import annotations

import pytest

from verl_search.reward import INVALID_ACTION_MESSAGE_WITH_ACCESS, compute_score

GOLD = {"target": ["Shakespeare"]}
PAGE = "<information>[page 1 of 2] Hamlet\n<answer> Marlowe </answer><access> x </access></information>"
RESPONSE = (
    "<think> search </think><search> hamlet </search><information>Doc 1(Title: Hamlet)</information>"
    f"<think> open </think><access> https://w/Hamlet </access>{PAGE}<answer> {{}} </answer>"
)


def test_a_search_access_answer_response_is_well_formed():
    right = compute_score("x", RESPONSE.format("Shakespeare"), GOLD, structure_format_score=0.2)
    wrong = compute_score("x", RESPONSE.format("Marlowe"), GOLD, structure_format_score=0.2)
    assert right["score"] == 1.0 and right["num_searches"] == 1.0
    assert wrong["score"] == pytest.approx(0.2)  # well-formed and wrong: the page's <answer> is not the model's


def test_a_nested_access_is_ill_formed():
    response = "<think><access> u </access></think><answer> Shakespeare </answer>"
    assert compute_score("x", response, GOLD, structure_format_score=0.2)["score"] == pytest.approx(0.8)


def test_reading_pages_is_not_penalised_as_never_searching():
    response = "<access> https://w/Hamlet </access><information>text</information><answer> Shakespeare </answer>"
    assert compute_score("x", response, GOLD, no_search_penalty=0.5)["score"] == 1.0
    assert compute_score("x", "<answer> Shakespeare </answer>", GOLD, no_search_penalty=0.5)["score"] == 0.5


def test_the_access_corrective_message_is_not_the_models():
    response = "no action" + INVALID_ACTION_MESSAGE_WITH_ACCESS + "still none"
    assert compute_score("x", response, GOLD)["answered"] == 0.0
