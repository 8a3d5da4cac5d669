"""The test kit's forced openings: which requests open with a search call or an answer, that the rollout server
forces exactly those tokens, and what it records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cpu_bench.testing.forced_prefix import POLICY_PATH, ForcedOpenings, ForcingSettings, Openings
from verl_search.cpu.options import CpuRolloutOptions
from verl_search.cpu.rollout import server_class
from verl_search.errors import CpuRolloutConfigError

FIRST_TURN = "<|im_start|>user\nAnswer it. Question: what is the capital of france?<|im_end|>\n<|im_start|>assistant\n"
HERMES_FIRST_TURN = "<|im_start|>system\n<tools>[...]</tools><|im_end|>\n" + FIRST_TURN
AFTER_RESULT = FIRST_TURN + "<search> q </search>\n\n<information>Doc 1</information>\n\n"
CONFIG = SimpleNamespace(max_model_len=512, prompt_length=256, response_length=64)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from cpu_bench.train.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


def test_every_kth_first_turn_opens_with_a_search_in_the_prompts_protocol():
    openings = Openings(ForcingSettings(search_every=2))
    assert openings.opening_for(FIRST_TURN) == "<search> what is the capital of france? </search>"
    assert openings.opening_for(FIRST_TURN) == ""  # the 2nd is the model's own
    hermes = openings.opening_for(HERMES_FIRST_TURN)
    assert hermes.startswith("<tool_call>\n") and json.loads(hermes.split("\n")[1]) == {
        "name": "search",
        "arguments": {"query_list": ["what is the capital of france?"]},
    }


def test_turns_after_a_search_result_open_with_the_answer_and_are_counted_apart():
    openings = Openings(ForcingSettings(search_every=1, answer="Paris", answer_every=2))
    assert openings.opening_for(AFTER_RESULT) == "<answer> Paris </answer>"
    assert openings.opening_for(FIRST_TURN).startswith("<search>")  # first turns keep their own count
    assert openings.opening_for(AFTER_RESULT) == ""
    assert openings.opening_for(AFTER_RESULT) == "<answer> Paris </answer>"


def test_without_settings_nothing_is_forced():
    openings = Openings(ForcingSettings())
    assert [openings.opening_for(p) for p in (FIRST_TURN, AFTER_RESULT, HERMES_FIRST_TURN)] == ["", "", ""]


def test_named_by_the_rollout_options_with_its_settings():
    options = CpuRolloutOptions.from_engine_kwargs(
        {"hf_cpu": {"opening_policy": {"path": POLICY_PATH, "search_every": 1, "answer": "Paris", "answer_every": 1}}}
    )
    assert server_class(options) is ForcedOpenings
    assert ForcingSettings.of(options) == ForcingSettings(search_every=1, answer="Paris", answer_every=1)
    colon_path = POLICY_PATH.rpartition(".")[0] + ":ForcedOpenings"
    assert server_class(CpuRolloutOptions(opening_policy=colon_path)) is ForcedOpenings


def test_an_unknown_or_bad_setting_is_a_config_error_naming_it():
    with pytest.raises(CpuRolloutConfigError, match="opening_policy.search_evry"):
        ForcingSettings.of(CpuRolloutOptions(opening_policy={"path": POLICY_PATH, "search_evry": 2}))
    with pytest.raises(CpuRolloutConfigError, match="opening_policy.answer_every"):
        ForcingSettings.of(CpuRolloutOptions(opening_policy={"path": POLICY_PATH, "answer_every": -1}))


async def test_the_server_forces_the_opening_and_records_its_events(tiny_model, tmp_path):
    policy = {"path": POLICY_PATH, "search_every": 1, "record_dir": str(tmp_path)}
    server = ForcedOpenings(CONFIG, str(tiny_model), replica_rank=0, options={"opening_policy": policy})
    prompt_ids = server.tokenizer.encode(FIRST_TURN, add_special_tokens=False)
    forced = server.tokenizer.encode("<search> what is the capital of france? </search>", add_special_tokens=False)
    out = await server.generate(prompt_ids, {"max_tokens": len(forced) + 4, "temperature": 1.0}, "r1")
    assert out.token_ids[: len(forced)] == forced

    norm = server.model.state_dict()["model.norm.weight"]
    await server.update_weights({"model.norm.weight": torch.full_like(norm, 2.0)}, global_steps=1)
    (path,) = tmp_path.glob("server-0-*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "generate", "update_weights"]
    assert events[1]["request_id"] == "r1" and events[1]["token_ids"] == out.token_ids
    assert events[0]["fingerprint"] != events[2]["fingerprint"] and events[2]["global_steps"] == 1


async def test_without_a_record_dir_nothing_is_written(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = ForcedOpenings(CONFIG, str(tiny_model), replica_rank=0, options={"opening_policy": POLICY_PATH})
    prompt_ids = server.tokenizer.encode(FIRST_TURN, add_special_tokens=False)
    await server.generate(prompt_ids, {"max_tokens": 4, "temperature": 1.0}, "r1")
    assert list(tmp_path.iterdir()) == []
