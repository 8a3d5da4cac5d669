"""The test kit's opening policy: which requests it opens with a search call or an answer, and what it records."""

from __future__ import annotations

import json

import pytest

from cpu_bench.testing.forced_prefix import POLICY_PATH, ForcedOpenings
from verl_search.cpu.options import CpuRolloutOptions
from verl_search.errors import CpuRolloutConfigError

FIRST_TURN = "<|im_start|>user\nAnswer it. Question: what is the capital of france?<|im_end|>\n<|im_start|>assistant\n"
HERMES_FIRST_TURN = "<|im_start|>system\n<tools>[...]</tools><|im_end|>\n" + FIRST_TURN
AFTER_RESULT = FIRST_TURN + "<search> q </search>\n\n<information>Doc 1</information>\n\n"


def test_every_kth_first_turn_opens_with_a_search_in_the_prompts_protocol():
    policy = ForcedOpenings(search_every=2)
    assert policy.opening_for(FIRST_TURN) == "<search> what is the capital of france? </search>"
    assert policy.opening_for(FIRST_TURN) == ""  # the 2nd is the model's own
    hermes = policy.opening_for(HERMES_FIRST_TURN)
    assert hermes.startswith("<tool_call>\n") and json.loads(hermes.split("\n")[1]) == {
        "name": "search",
        "arguments": {"query_list": ["what is the capital of france?"]},
    }


def test_turns_after_a_search_result_open_with_the_answer_and_are_counted_apart():
    policy = ForcedOpenings(search_every=1, answer="Paris", answer_every=2)
    assert policy.opening_for(AFTER_RESULT) == "<answer> Paris </answer>"
    assert policy.opening_for(FIRST_TURN).startswith("<search>")  # first turns keep their own count
    assert policy.opening_for(AFTER_RESULT) == ""
    assert policy.opening_for(AFTER_RESULT) == "<answer> Paris </answer>"


def test_without_settings_nothing_is_forced():
    policy = ForcedOpenings()
    assert [policy.opening_for(p) for p in (FIRST_TURN, AFTER_RESULT, HERMES_FIRST_TURN)] == ["", "", ""]


def test_events_are_recorded_per_server_when_asked(tmp_path):
    policy = ForcedOpenings(replica_rank=3, record_dir=str(tmp_path / "records"))
    policy.observe({"event": "start", "fingerprint": "abc"})
    policy.observe({"event": "generate", "token_ids": [1, 2]})
    (path,) = (tmp_path / "records").glob("server-3-*.jsonl")
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["start", "generate"]


def test_named_by_the_rollout_options_with_its_settings(tmp_path):
    options = CpuRolloutOptions.from_engine_kwargs(
        {"hf_cpu": {"opening_policy": {"path": POLICY_PATH, "search_every": 1, "answer": "Paris", "answer_every": 1}}}
    )
    policy = options.build_opening_policy(replica_rank=0)
    assert isinstance(policy, ForcedOpenings) and policy.opening_for(AFTER_RESULT) == "<answer> Paris </answer>"
    colon_path = POLICY_PATH.rpartition(".")[0] + ":ForcedOpenings"
    assert isinstance(CpuRolloutOptions(opening_policy=colon_path).build_opening_policy(0), ForcedOpenings)


def test_an_unknown_or_bad_setting_is_a_config_error_naming_it():
    options = CpuRolloutOptions(opening_policy={"path": POLICY_PATH, "search_evry": 2})
    with pytest.raises(CpuRolloutConfigError, match="opening_policy.*search_evry"):
        options.build_opening_policy(0)
    options = CpuRolloutOptions(opening_policy={"path": POLICY_PATH, "answer_every": -1})
    with pytest.raises(CpuRolloutConfigError, match="answer_every"):
        options.build_opening_policy(0)
