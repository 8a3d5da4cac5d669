"""The test kit's scripted harness: scripted server semantics, the oracle reader, and clear errors for bad input."""

from __future__ import annotations

import pytest
from omegaconf.errors import ConfigKeyError

from cpu_bench.testing import forced_prefix
from cpu_bench.testing.scripted_policy import OracleReader, ScriptedServerManager, question_of, scripted_turns
from cpu_bench.testing.scripted_rollout import rows_to_batch, verl_trainer_config


async def test_scripted_server_stops_like_a_rollout_server(tokenizer):
    server = ScriptedServerManager(tokenizer, scripted_turns("<search> q </search> more"))
    out = await server.generate(
        "r", prompt_ids=[1], sampling_params={"stop": ["</search>"], "include_stop_str_in_output": True, "logprobs": 1}
    )
    assert tokenizer.decode(out.token_ids) == "<search> q </search>"  # stopped, no EOS
    assert out.log_probs == [-0.25] * len(out.token_ids)
    out = await server.generate("r", prompt_ids=[1], sampling_params={"max_tokens": 3})
    assert len(out.token_ids) == 3 and out.log_probs is None
    out = await server.generate("s", prompt_ids=[1], sampling_params={})
    assert out.token_ids[-1] == tokenizer.eos_token_id  # no stop string: the turn ends with EOS
    assert [c.request_id for c in server.calls] == ["r", "r", "s"]


async def test_policy_returning_non_text_is_a_clear_error(tokenizer):
    server = ScriptedServerManager(tokenizer, lambda inp: None)
    with pytest.raises(TypeError, match="policy must return the assistant text"):
        await server.generate("r", prompt_ids=[1], sampling_params={})


def test_oracle_reader_answers_only_what_was_retrieved():
    reader = OracleReader({"who wrote hamlet?": ["William Shakespeare"]})
    assert reader("who wrote hamlet?", 'Doc 1(Title: "Hamlet") written by William Shakespeare') == "William Shakespeare"
    assert reader("who wrote hamlet?", "nothing useful") == "unknown"
    assert reader("never asked", "William Shakespeare") == "unknown"


USER = "<|im_start|>user\nAnswer it. Question: who wrote hamlet?\n<|im_end|>\n"
ASSISTANT = "<|im_start|>assistant\n"
TOOL_TURN = "<|im_start|>user\n<tool_response>\nQuestion: not this one\n</tool_response><|im_end|>\n"


@pytest.mark.parametrize(
    "text",
    [
        # the rollout server's first-turn prompts (the forcing policy's input): system prompt, tools listed or not
        USER + ASSISTANT,
        "<|im_start|>system\nYou may search. Question: comes later.<|im_end|>\n" + USER + ASSISTANT,
        "<|im_start|>system\n<tools>[...]</tools><|im_end|>\n" + USER + ASSISTANT,
        # the scripted policies' input: the whole conversation, tool results come back as later user turns
        USER + ASSISTANT + "<tool_call>...</tool_call><|im_end|>\n" + TOOL_TURN + ASSISTANT,
        USER + ASSISTANT + "<search> q </search>\n\n<information>Question: not this one</information>\n\n",
    ],
    ids=["first turn", "system prompt", "tools listed", "after a tool response", "after information"],
)
def test_question_of_reads_the_first_user_turn(text):
    assert question_of(text) == "who wrote hamlet?"
    assert forced_prefix.question_of is question_of  # one reader for the forcing policy and the scripted policies


def test_question_of_without_a_question_mark_is_the_whole_turn_and_without_a_user_turn_an_error():
    assert question_of("<|im_start|>user\n who wrote hamlet? <|im_end|>\n" + ASSISTANT) == "who wrote hamlet?"
    with pytest.raises(ValueError, match="no user turn"):
        question_of(ASSISTANT)


def test_bad_policy_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one text"):
        scripted_turns()


def test_bad_rows_and_config_keys_are_rejected():
    with pytest.raises(ValueError, match="rows is empty"):
        rows_to_batch([])
    with pytest.raises(ValueError, match="needs 'prompt'"):
        rows_to_batch([{"agent_name": "tool_agent"}])
    with pytest.raises(ValueError, match="no 'agent_name'"):
        rows_to_batch([{"prompt": [{"role": "user", "content": "q"}]}])
    with pytest.raises(ConfigKeyError):
        verl_trainer_config(["actor_rollout_ref.rollout.multi_turn.max_asistant_turns=3"])
