"""The reward's rules, one table row each: what a response earns and what it reports."""

from __future__ import annotations

import numpy as np
import pytest

from verl_search.errors import ConfigError
from verl_search.reward import compute_score, normalize_answer

GOLD = {"target": ["Beijing", "Peking"]}

# (case, response, expected score) with default options: plain Search-R1 exact match
EM_CASES = [
    ("exact", "<think>easy</think><answer>Beijing</answer>", 1.0),
    ("other gold", "<answer>Peking</answer>", 1.0),
    ("normalised: case, punctuation, article, spaces", "<answer>  the  BEIJING!! </answer>", 1.0),
    ("wrong", "<answer>Shanghai</answer>", 0.0),
    ("no answer block", "I think it is Beijing.", 0.0),
    ("unclosed answer", "<answer>Beijing", 0.0),
    ("superset is not exact", "<answer>Beijing, China</answer>", 0.0),
    ("last answer counts (wrong last)", "<answer>Beijing</answer> wait <answer>Shanghai</answer>", 0.0),
    ("last answer counts (right last)", "<answer>Shanghai</answer> no <answer>Beijing</answer>", 1.0),
    (
        "answer inside <information> never counts",
        "<search>capital</search><information>Doc 1 <answer>Beijing</answer></information>",
        0.0,
    ),
    (
        "answer inside <tool_response> never counts",
        '<tool_call>{"name": "search", "arguments": {"query_list": ["q"]}}</tool_call>'
        "user\n<tool_response><answer>Beijing</answer></tool_response>assistant\n<answer>Shanghai</answer>",
        0.0,
    ),
    (
        "retrieved answer after the model's answer does not override it",
        "<answer>Beijing</answer><information><answer>Shanghai</answer></information>",
        1.0,
    ),
    ("unclosed retrieved block hides the rest", "<information>truncated <answer>Beijing</answer>", 0.0),
    ("empty answer", "<answer> </answer>", 0.0),
    ("10 answer tags: full score", "<answer>x</answer>" * 9 + "<answer>Beijing</answer>", 1.0),
    ("11 answer tags: correct earns 0.25", "<answer>x</answer>" * 10 + "<answer>Beijing</answer>", 0.25),
    ("11 closing tags only", "</answer>" * 10 + "<answer>Beijing</answer>", 0.25),
    ("11 tags but wrong: 0", "<answer>x</answer>" * 10 + "<answer>Paris</answer>", 0.0),
    (
        "tags inside retrieved text are not counted",
        "<information>" + "<answer>x</answer>" * 20 + "</information><answer>Beijing</answer>",
        1.0,
    ),
]


@pytest.mark.parametrize(("case", "response", "expected"), EM_CASES, ids=[c[0] for c in EM_CASES])
def test_em_score(case, response, expected):
    assert compute_score("searchR1_nq", response, GOLD)["score"] == expected


@pytest.mark.parametrize(
    "ground_truth",
    [
        {"target": ["Beijing"]},
        {"target": np.array(["Shanghai", "Beijing"], dtype=object)},
        {"target": "Beijing"},
        ["Beijing"],
        ("Beijing",),
        np.array(["Beijing"]),
        "Beijing",
    ],
    ids=["dict-list", "dict-ndarray", "dict-str", "list", "tuple", "ndarray", "str"],
)
def test_every_ground_truth_shape_is_accepted(ground_truth):
    assert compute_score("searchR1_nq", "<answer>beijing</answer>", ground_truth)["score"] == 1.0


def test_numeric_gold_answers_compare_as_text():
    assert compute_score("searchR1_toy", "<answer>1969</answer>", {"target": [1969]})["em"] == 1.0


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ({"answers": ["x"]}, "no 'target' key"),
        ({"target": []}, "no gold answer"),
        (np.array([], dtype=object), "no gold answer"),
        (None, "must be a dict"),
        (42, "must be a dict"),
        ({"target": [["nested"]]}, "must be strings"),
        ({"target": [None]}, "must be strings"),
    ],
)
def test_bad_ground_truth_is_a_clear_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        compute_score("searchR1_nq", "<answer>x</answer>", ground_truth)


def test_non_string_response_is_a_clear_error():
    with pytest.raises(TypeError, match="solution_str must be a string"):
        compute_score("searchR1_nq", None, GOLD)


def test_gold_that_normalises_to_nothing_never_matches():
    # "The" normalises to "" -- an empty or all-article answer must not be rewarded for it
    assert compute_score("x", "<answer>a</answer>", ["The"])["score"] == 0.0
    assert compute_score("x", "<answer>anything at all</answer>", ["The"], metric="subem")["score"] == 0.0


def test_reports_every_metric_and_counts():
    response = (
        "<think>need facts</think>"
        '<tool_call>{"name": "search", "arguments": {"query_list": ["capital of china"]}}</tool_call>'
        "<tool_response>Doc 1(Title: China) capital Beijing</tool_response>"
        "<search>again</search><information>Doc 1</information>"
        "<answer>Beijing city</answer>"
    )
    result = compute_score("searchR1_nq", response, GOLD)
    assert result == {
        "score": 0.0, "em": 0.0, "subem": 1.0, "f1": pytest.approx(2 / 3), "answered": 1.0, "num_searches": 2.0,
        "failed_searches": 0.0, "gold_in_results": 1.0, "search_latency_s": 0.0, "search_cached": 0.0,
    }  # fmt: skip


def test_same_keys_when_unanswered():
    result = compute_score("searchR1_nq", "no idea", GOLD)
    assert result == {
        "score": 0.0, "em": 0.0, "subem": 0.0, "f1": 0.0, "answered": 0.0, "num_searches": 0.0,
        "failed_searches": 0.0, "gold_in_results": 0.0, "search_latency_s": 0.0, "search_cached": 0.0,
    }  # fmt: skip


def test_searches_inside_retrieved_text_are_not_counted():
    response = "<search>q</search><information><search>fake</search></information><answer>x</answer>"
    assert compute_score("x", response, GOLD)["num_searches"] == 1.0


@pytest.mark.parametrize(
    ("metric", "response", "expected"),
    [
        ("subem", "<answer>It is Beijing, China</answer>", 1.0),
        ("subem", "<answer>Shanghai</answer>", 0.0),
        ("f1", "<answer>Beijing city</answer>", pytest.approx(2 / 3)),
        ("f1", "<answer>Beijing</answer>", 1.0),
        ("f1", "<answer>Shanghai</answer>", 0.0),
        ("em", "<answer>It is Beijing, China</answer>", 0.0),
    ],
)
def test_metric_option_picks_the_score(metric, response, expected):
    assert compute_score("searchR1_nq", response, GOLD, metric=metric)["score"] == expected


def test_tag_spam_scales_f1_too():
    response = "<answer>x</answer>" * 10 + "<answer>Beijing city</answer>"
    assert compute_score("x", response, GOLD, metric="f1")["score"] == pytest.approx(0.25 * 2 / 3)


FORMAT = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.1}
WELL_FORMED_WRONG = "<think>hm</think><search>q</search><information>Doc</information><answer>Shanghai</answer>"


@pytest.mark.parametrize(
    ("case", "response", "expected"),
    [
        ("well-formed, correct",
         "<think>t</think><search>q</search><information>d</information><answer>Beijing</answer>", 1.0),
        ("well-formed, wrong", WELL_FORMED_WRONG, 0.2),
        ("well-formed, wrong, gold in retrieved text",
         "<search>q</search><information>Beijing is the capital</information><answer>Shanghai</answer>", 0.3),
        ("ill-formed (unclosed think), correct", "<think>t <answer>Beijing</answer>", 0.8),
        ("ill-formed (text after answer), correct", "<answer>Beijing</answer> trailing words", 0.8),
        ("ill-formed (two answers), correct", "<answer>x</answer><answer>Beijing</answer>", 0.8),
        ("ill-formed, wrong answer", "<think><answer>Shanghai</answer></think>", 0.1),
        ("ill-formed, no answer", "<think>t", 0.0),
        ("well-formed tags but no answer", "<think>t</think><search>q</search>", 0.0),
        ("tool_call protocol, well-formed, wrong",
         '<think>t</think><tool_call>{"name": "search"}</tool_call>user\n<tool_response>d</tool_response>'
         "assistant\n<answer>Shanghai</answer>\n", 0.2),
    ],
)  # fmt: skip
def test_format_reward(case, response, expected):
    assert compute_score("searchR1_nq", response, GOLD, **FORMAT)["score"] == pytest.approx(expected)


def test_format_reward_is_off_by_default():
    assert compute_score("searchR1_nq", WELL_FORMED_WRONG, GOLD)["score"] == 0.0


def test_no_search_penalty_costs_only_responses_that_never_searched():
    direct = "<answer>Beijing</answer>"
    searched = "<search>q</search><information>d</information><answer>Beijing</answer>"
    hermes = '<tool_call>{"name": "search"}</tool_call><tool_response>d</tool_response><answer>Beijing</answer>'
    assert compute_score("x", direct, GOLD, no_search_penalty=0.3)["score"] == pytest.approx(0.7)
    assert compute_score("x", searched, GOLD, no_search_penalty=0.3)["score"] == 1.0
    assert compute_score("x", hermes, GOLD, no_search_penalty=0.3)["score"] == 1.0
    assert compute_score("x", "<answer>Shanghai</answer>", GOLD, no_search_penalty=0.3)["score"] == 0.0  # floor 0
    assert compute_score("x", direct, GOLD)["score"] == 1.0  # off by default
    with pytest.raises(ConfigError, match="no_search_penalty"):
        compute_score("x", direct, GOLD, no_search_penalty=1.0)


def test_strict_single_answer():
    two = "<answer>Shanghai</answer><answer>Beijing</answer>"
    assert compute_score("x", two, GOLD)["score"] == 1.0
    strict = compute_score("x", two, GOLD, strict_single_answer=True)
    assert strict["score"] == 0.0 and strict["em"] == 1.0
    assert compute_score("x", "<answer>Beijing</answer>", GOLD, strict_single_answer=True)["score"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": "accuracy"}, "reward option metric"),
        ({"formatscore": 0.1}, "reward option formatscore"),
        ({"structure_format_score": 1.5}, "reward option structure_format_score"),
        ({"structure_format_score": 0.6, "retrieval_score": 0.5}, "must stay below 1"),
        ({"max_answer_tags": 0}, "reward option max_answer_tags"),
    ],
)
def test_bad_options_are_a_config_error_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        compute_score("x", "<answer>Beijing</answer>", GOLD, **kwargs)


def test_framework_kwargs_from_verl_are_accepted():
    result = compute_score(
        "x", "<answer>Beijing</answer>", GOLD, reward_router_address=None, reward_model_tokenizer=None
    )
    assert result["score"] == 1.0


def test_extra_info_and_data_source_do_not_change_the_score():
    a = compute_score("searchR1_nq", "<answer>Beijing</answer>", GOLD)
    b = compute_score("anything", "<answer>Beijing</answer>", GOLD, extra_info={"num_turns": 3, "index": 7})
    assert a == b


@pytest.mark.parametrize(
    ("text", "expected"),
    [("The  Beijing, China!", "beijing china"), ("An apple a day", "apple day"), ("theatre", "theatre"), ("", "")],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_failed_searches_are_counted_from_the_tool_text_of_either_loop():
    from verl_search.errors import DeadlineExceeded, ServiceUnavailable
    from verl_search.tool.config import SearchToolConfig
    from verl_search.tool.search_tool import failure_text

    config = SearchToolConfig()
    timeout, down = failure_text(DeadlineExceeded("x"), config), failure_text(ServiceUnavailable("x"), config)
    response = (
        '<tool_call>{"name": "search", "arguments": {"query_list": ["a"]}}</tool_call>'
        f"<tool_response>{timeout}</tool_response>"
        "<search> a </search>"
        f"\n\n<information>{down}</information>\n\n"
        "<search> b </search><information>Doc 1(Title: X) fine</information><answer> Paris </answer>"
    )
    result = compute_score("searchR1_nq", response, {"target": ["Paris"]})
    assert result["failed_searches"] == 2.0
    assert result["num_searches"] == 3.0
    assert result["em"] == 1.0


def test_agent_loop_search_stats_pass_through_with_fixed_keys():
    response = "<answer> Paris </answer>"
    with_stats = compute_score("searchR1_nq", response, ["Paris"], {"search_latency_s": 0.25, "search_cached": 2})
    without = compute_score("searchR1_nq", response, ["Paris"], {"index": 3})
    assert (with_stats["search_latency_s"], with_stats["search_cached"]) == (0.25, 2.0)
    assert (without["search_latency_s"], without["search_cached"]) == (0.0, 0.0)
    assert with_stats.keys() == without.keys()


# What search_r1_agent adds after a malformed turn and before the last one (mask 0): it quotes the protocol's tags.
INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
FINAL = "\nI have used all my searches. I must now give the final answer between <answer> and </answer>.\n"


def test_loop_messages_are_the_ones_the_agent_loop_writes():
    from verl_search.agent_loop import INVALID_ACTION_MESSAGE, SearchR1LoopConfig

    assert (INVALID_ACTION_MESSAGE, SearchR1LoopConfig().final_turn_instruction) == (INVALID, FINAL)


def test_tags_quoted_by_the_loops_messages_are_not_the_models():
    response = "I think it is Beijing." + INVALID + "Still thinking." + FINAL + "Beijing, surely."
    result = compute_score("searchR1_nq", response, GOLD)
    assert (result["answered"], result["num_searches"], result["score"]) == (0.0, 0.0, 0.0)


def test_answer_after_a_corrective_message_is_a_single_well_formed_answer():
    response = "<think>hm</think> Beijing?" + INVALID + "<think>ok</think><answer>Beijing</answer>"
    assert compute_score("x", response, GOLD, strict_single_answer=True)["score"] == 1.0
    result = compute_score("x", "<think>hm</think>" + INVALID + "<answer>Shanghai</answer>", GOLD, **FORMAT)
    assert result["score"] == pytest.approx(0.2)  # well-formed and wrong: the message's tags don't break the format
    assert (result["answered"], result["num_searches"]) == (1.0, 0.0)


def test_searches_are_counted_around_the_loops_messages():
    response = (
        "<search> a </search>\n\n<information>Doc 1</information>\n\n" + "no action" + INVALID + FINAL
        + "<answer> Beijing </answer>"
    )  # fmt: skip
    result = compute_score("searchR1_nq", response, GOLD)
    assert (result["num_searches"], result["answered"], result["em"]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("cut", ["</search>.", "<answer> and", "</answer>. Let me"])
def test_a_message_cut_off_by_the_response_length_is_not_the_models(cut):
    response = "no action" + INVALID[: INVALID.index(cut) + len(cut)]
    result = compute_score("searchR1_nq", response, GOLD)
    assert (result["answered"], result["num_searches"]) == (0.0, 0.0)


def test_a_custom_final_instruction_listed_by_the_loop_is_not_the_models():
    custom = "\nLast turn: answer as <answer> and </answer>, no more <search> and </search>.\n"
    response = "<search> q </search><information>Doc</information>" + custom + "no idea"
    result = compute_score("searchR1_nq", response, GOLD, {"loop_messages": [custom]})
    assert (result["answered"], result["num_searches"]) == (0.0, 1.0)
    assert compute_score("searchR1_nq", response, GOLD, {"loop_messages": None})["answered"] == 1.0  # not listed
