"""The native search_r1_agent loop run by verl's AgentLoopWorker on CPU, against a real local /retrieve server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from verl.utils.reward_score import default_compute_score

from cpu_bench.testing.scripted_policy import native_search_policy, scripted_turns
from cpu_bench.testing.scripted_rollout import run_rows
from verl_search.agent_loop import INVALID_ACTION_MESSAGE, SearchR1LoopConfig, parse_action
from verl_search.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
AGENT = "search_r1_agent"
HAMLET = "who wrote hamlet?"
FINAL = SearchR1LoopConfig().final_turn_instruction


@pytest.fixture
def run(retriever, tool_yaml, tokenizer_dir, rows):
    """Run one Hamlet row through search_r1_agent with the given policy; return (trajectory, its generate calls)."""

    async def go(policy, **kwargs):
        kwargs.setdefault("tool_config_path", tool_yaml)
        kwargs.setdefault("compute_score", default_compute_score)
        result = await run_rows(
            [rows(HAMLET, AGENT)],
            policy=policy,
            tokenizer_dir=tokenizer_dir,
            **kwargs,
        )
        return result.trajectories[0], result.calls

    return go


async def test_search_then_answer_is_token_exact(run, retriever, tokenizer, oracle):
    trajectory, calls = await run(native_search_policy(oracle))
    first, second = calls
    assert first.text.endswith("<search> who wrote hamlet? </search>")
    assert retriever.queries == [HAMLET]
    information = (
        '\n\n<information>Doc 1(Title: "Hamlet") Hamlet is a tragedy written by William Shakespeare around 1600.'
    )
    observation_ids = trajectory.response_ids[len(first.token_ids) : -len(second.token_ids)]
    observation = tokenizer.decode(observation_ids)
    assert observation.startswith(information) and observation.endswith("</information>\n\n")
    # the model's own tokens are kept exactly as generated; only the observation is masked out
    assert trajectory.response_ids == first.token_ids + observation_ids + second.token_ids
    assert trajectory.response_mask == [1] * len(first.token_ids) + [0] * len(observation_ids) + [1] * len(
        second.token_ids
    )
    assert trajectory.response_logprobs == (
        [-0.25] * len(first.token_ids) + [0.0] * len(observation_ids) + [-0.25] * len(second.token_ids)
    )
    # the second turn continued from exactly prompt + first turn + observation
    assert second.prompt_ids == trajectory.prompt_ids + first.token_ids + observation_ids
    assert trajectory.prompt_ids == tokenizer.apply_chat_template(
        [{"role": "user", "content": tokenizer.decode(first.prompt_ids).split("user\n", 1)[1].split("<|im_end|>")[0]}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert trajectory.score == 1.0
    assert trajectory.num_turns == 4
    assert trajectory.extra_fields["search_calls"] == 1
    assert trajectory.extra_fields["search_failures"] == 0
    assert trajectory.extra_fields["invalid_actions"] == 0
    assert trajectory.extra_fields["search_latency_s"] > 0
    assert trajectory.metrics["tool_calls"] > 0 and trajectory.metrics["generate_sequences"] > 0


async def test_generation_stops_at_search_and_answer_tags(run, oracle):
    _, calls = await run(native_search_policy(oracle), response_length=512)
    params = calls[0].sampling_params
    assert set(params["stop"]) == {"</search>", "</answer>"}
    assert params["include_stop_str_in_output"] is True  # vllm spelling; sglang gets no_stop_trim
    assert params["max_tokens"] == 512
    assert calls[1].sampling_params["max_tokens"] == 512 - (len(calls[1].prompt_ids) - len(calls[0].prompt_ids))


async def test_overshooting_server_is_cut_after_the_action(run, retriever, tokenizer):
    policy = scripted_turns(
        "<search> who wrote hamlet? </search>\n<information>made up by the model</information>",
        "<answer> William Shakespeare </answer> and then some",
    )
    trajectory, calls = await run(policy, honour_stop=False)
    assert "made up by the model" not in trajectory.response_text
    assert "and then some" not in trajectory.response_text
    assert retriever.queries == [HAMLET]
    assert trajectory.response_text.endswith("<answer> William Shakespeare </answer>")
    kept = trajectory.response_ids[: trajectory.response_mask.index(0)]
    assert kept == calls[0].token_ids[: len(kept)]  # a prefix of what was generated, not a re-tokenisation
    assert tokenizer.decode(kept).endswith("</search>")


async def test_invalid_action_gets_search_r1_corrective_message(run, retriever):
    trajectory, calls = await run(
        scripted_turns("I think it is Shakespeare.", "<answer> William Shakespeare </answer>")
    )
    assert len(calls) == 2
    assert INVALID_ACTION_MESSAGE in trajectory.response_text
    assert "My previous action is invalid." in INVALID_ACTION_MESSAGE  # Search-R1's wording
    n1 = len(calls[0].token_ids)
    correction = trajectory.response_mask[n1 : len(trajectory.response_ids) - len(calls[1].token_ids)]
    assert correction and set(correction) == {0}
    assert trajectory.extra_fields["invalid_actions"] == 1
    assert trajectory.extra_fields["search_calls"] == 0
    assert retriever.queries == []
    assert trajectory.score == 1.0


async def test_turn_limit_forces_a_final_answer_turn(run, retriever):
    def always_search(inp):
        return f"<search> hamlet author {inp.call_index} </search>"

    trajectory, calls = await run(always_search, max_turns=3)
    assert len(calls) == 3  # 2 searches, then the last turn
    assert retriever.queries == ["hamlet author 0", "hamlet author 1"]  # the last turn's search is not executed
    assert trajectory.response_text.count(FINAL.strip()) == 1
    final_prompt = calls[2].prompt_ids
    assert trajectory.response_ids[-len(calls[2].token_ids) :] == calls[2].token_ids
    assert FINAL.strip() in trajectory.response_text.split("</information>")[-1]
    assert len(final_prompt) == len(trajectory.prompt_ids) + len(trajectory.response_ids) - len(calls[2].token_ids)
    assert trajectory.extra_fields["search_calls"] == 2
    assert trajectory.score == 0.0  # never answered


async def test_failed_search_is_shown_to_the_model_and_counted(run, retriever, oracle):
    retriever.failing = True
    trajectory, calls = await run(native_search_policy(oracle))
    assert "<information>[search failed: server_error]" in trajectory.response_text
    assert trajectory.extra_fields["search_failures"] == 1
    assert trajectory.response_text.endswith("<answer> unknown </answer>")
    assert len(calls) == 2


async def test_response_length_is_never_exceeded(run):
    long_turn = "<think> " + "very long reasoning " * 200 + "</think>"
    trajectory, calls = await run(scripted_turns(long_turn), response_length=64)
    assert len(trajectory.response_ids) == 64
    assert len(calls) == 1
    assert calls[0].sampling_params["max_tokens"] == 64


@pytest.mark.parametrize("response_length", [1024, 64])
async def test_a_result_cut_at_the_response_length_is_counted(run, oracle, response_length):
    """The loop cuts a result that does not fit in the response: it says so, with the tokens the model missed."""
    from verl_search.monitor.step_metrics import search_step_metrics

    trajectory, _ = await run(native_search_policy(oracle), response_length=response_length)
    fields = trajectory.extra_fields
    assert fields["search_calls"] == 1
    full = response_length == 1024
    assert fields["search_results_cut"] == (0 if full else 1)
    assert (fields["search_result_tokens_cut"] == 0) == full
    assert full or len(trajectory.response_ids) == 64  # the result filled what was left, and no more
    m = search_step_metrics([fields], response_lens=[len(trajectory.response_ids)])
    assert m["search/results_cut_share"] == (0 if full else 1)


async def test_agent_loop_yaml_options_are_applied(run, retriever, tmp_path, oracle):
    entries = yaml.safe_load((REPO / "tool_config" / "search_r1_agent.yaml").read_text())
    assert entries[0]["name"] == AGENT
    entries[0].update(max_turns=2, search={"retrieval_service_url": retriever.url, "topk": 1})
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(entries))
    trajectory, calls = await run(
        scripted_turns("<search> capital of france </search>"), tool_config_path=None, agent_loop_config_path=path
    )
    assert len(calls) == 2  # max_turns=2 from the YAML, not the run's 4
    assert trajectory.response_text.count("Doc ") == 1  # topk=1 from the inline search config
    assert 'Doc 1(Title: "Paris")' in trajectory.response_text


async def test_unknown_agent_loop_option_is_a_config_error(run, tmp_path, oracle):
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump([{"name": AGENT, "_target_": "verl_search.agent_loop.SearchR1AgentLoop", "max_turn": 3}])
    )
    with pytest.raises(Exception) as info:
        await run(native_search_policy(oracle), agent_loop_config_path=path)
    assert _caused_by(info.value, ConfigError, "max_turn")


async def test_missing_search_config_is_a_config_error(run, oracle):
    with pytest.raises(Exception) as info:
        await run(native_search_policy(oracle), tool_config_path=None)
    assert _caused_by(info.value, ConfigError, "tool_config_path")


def _caused_by(error: BaseException | None, kind: type, text: str) -> bool:
    while error is not None:
        if isinstance(error, kind) and text in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


async def test_sglang_is_asked_to_keep_the_stop_string(run, oracle):
    trajectory, calls = await run(
        native_search_policy(oracle),
        rollout_name="sglang",
        overrides=["actor_rollout_ref.rollout.skip_tokenizer_init=False"],
    )
    params = calls[0].sampling_params
    assert params["no_stop_trim"] is True and "include_stop_str_in_output" not in params
    assert params["stop"] == ["</search>", "</answer>"]
    assert trajectory.score == 1.0


async def test_vllm_gets_only_its_own_stop_flag(run, oracle):
    _, calls = await run(native_search_policy(oracle), rollout_name="vllm")
    params = calls[0].sampling_params
    assert params["include_stop_str_in_output"] is True and "no_stop_trim" not in params
    assert params["stop"] == ["</search>", "</answer>"]


async def test_sglang_without_its_tokenizer_is_a_config_error(run, oracle):
    """verl's default skip_tokenizer_init=True makes SGLang's scheduler unable to match stop strings."""
    with pytest.raises(Exception) as info:
        await run(native_search_policy(oracle), rollout_name="sglang")
    assert _caused_by(info.value, ConfigError, "actor_rollout_ref.rollout.skip_tokenizer_init=False")


REWARD_FN = """
from verl.utils.reward_score import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {
        "score": float(default_compute_score(data_source, solution_str, ground_truth)),
        "searches_seen": float(extra_info["search_calls"]),
        "failures_seen": float(extra_info["search_failures"]),
    }
"""


async def test_search_stats_reach_verls_reward_loop(run, retriever, tmp_path, oracle):
    """Through verl's own RewardLoopWorker (as in training): the loop's stats arrive in extra_info, and the reward
    function's extra keys come back as reward_extra_info, which verl logs."""
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(REWARD_FN)
    retriever.failing = True
    trajectory, _ = await run(native_search_policy(oracle), reward_function=reward_file, compute_score=None)
    assert trajectory.score == 0.0  # the failed search retrieved nothing, so the oracle answered "unknown"
    assert trajectory.extra_fields["searches_seen"] == 1.0
    assert trajectory.extra_fields["failures_seen"] == 1.0


@pytest.mark.parametrize("final_instruction", [None, "\nLast turn. Reply <answer> and </answer>, not <search>.\n"])
async def test_reward_reads_only_the_models_text_not_the_loops_messages(run, retriever, tmp_path, final_instruction):
    """Both messages the loop adds quote <search>/<answer>: through verl's reward loop, our reward must not count
    them as the model's search or answer (a custom final_turn_instruction from the agent-loop YAML included)."""
    entries = yaml.safe_load((REPO / "tool_config" / "search_r1_agent.yaml").read_text())
    entries[0].update(max_turns=2, search={"retrieval_service_url": retriever.url})
    if final_instruction is not None:
        entries[0]["final_turn_instruction"] = final_instruction
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(entries))
    trajectory, calls = await run(
        scripted_turns("I think it is Shakespeare.", "Shakespeare, I believe."),
        tool_config_path=None,
        agent_loop_config_path=path,
        reward_function=REPO / "verl_search" / "reward.py",
        compute_score=None,
    )
    assert len(calls) == 2
    assert INVALID_ACTION_MESSAGE in trajectory.response_text
    assert (final_instruction or FINAL) in trajectory.response_text
    assert trajectory.extra_fields["answered"] == 0.0
    assert trajectory.extra_fields["num_searches"] == 0.0
    assert trajectory.score == 0.0


def test_parse_action_follows_search_r1():
    assert parse_action("<think>x</think><search> a b </search>") == ("search", "a b")
    assert parse_action("<answer> Paris </answer><search> q </search>") == ("answer", "Paris")
    assert parse_action("<search> unterminated") == (None, "")


def test_loop_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="extra"):
        SearchR1LoopConfig(max_turn=3)
