"""Our SearchTool driven by verl's own ToolAgentLoop (hermes <tool_call>), end to end on CPU with a scripted model."""

from __future__ import annotations

import pytest
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.reward_score import default_compute_score

from cpu_bench.testing.scripted_policy import question_of, tool_call_policy
from cpu_bench.testing.scripted_rollout import run_rows
from verl_search.tool.search_tool import SearchTool


def test_repo_tool_yaml_builds_our_tool(tool_yaml, retriever):
    tools = initialize_tools_from_config(str(tool_yaml))
    assert len(tools) == 1
    tool = tools[0]
    assert isinstance(tool, SearchTool)
    assert tool.name == "search"
    assert tool.search_config.retrieval_service_url == (retriever.url,)
    assert tool.tool_schema.function.parameters.properties["query_list"].type == "array"


@pytest.fixture
async def tool_agent_run(retriever, tool_yaml, tokenizer_dir, rows, oracle):
    batch = [rows("who wrote hamlet?", "tool_agent", 0), rows("who painted the mona lisa?", "tool_agent", 1)]
    result = await run_rows(
        batch,
        policy=tool_call_policy(oracle),
        tool_config_path=tool_yaml,
        tokenizer_dir=tokenizer_dir,
        compute_score=default_compute_score,
    )
    return batch, result


async def test_whole_trajectory_scores_under_verls_searchr1_reward(tool_agent_run, retriever):
    _, result = tool_agent_run
    hamlet, mona_lisa = result.trajectories
    # the tool really queried the server with the model's query_list
    assert sorted(retriever.queries) == ["who painted the mona lisa?", "who wrote hamlet?"]
    assert "<tool_response>" in hamlet.response_text
    assert 'Doc 1(Title: "Hamlet") Hamlet is a tragedy written by William Shakespeare' in hamlet.response_text
    assert hamlet.response_text.endswith("<answer> William Shakespeare </answer>")
    assert hamlet.score == 1.0
    # the gold answer is not in the corpus: the oracle reader answers "unknown" and EM is 0
    assert mona_lisa.response_text.endswith("<answer> unknown </answer>")
    assert mona_lisa.score == 0.0
    assert hamlet.num_turns == 4  # prompt, tool call, tool response, answer


def calls_for(result, question: str, tokenizer) -> list:
    """The generate calls of the one request whose prompt asks ``question``, in order.

    verl builds each row's prompt in a thread pool, so rows reach the server in no fixed order: ``result.calls[0]``
    may belong to any row (a faster thread, a cold chat-template cache) and must not be paired with trajectory 0.
    """
    ids = {c.request_id for c in result.calls if question_of(tokenizer.decode(c.prompt_ids)) == question}
    assert len(ids) == 1, f"expected one request asking {question!r}, got {len(ids)}"
    return [c for c in result.calls if c.request_id in ids]


async def test_tool_response_is_masked_and_model_tokens_are_exact(tool_agent_run, tokenizer):
    batch, result = tool_agent_run
    trajectory = result.trajectories[0]
    calls = calls_for(result, batch[0]["extra_info"]["question"], tokenizer)
    assert len(calls) == 2
    first, second = calls
    # the model saw the tool schema rendered by the chat template, and nothing else was generated before it
    assert '"name": "search"' in tokenizer.decode(first.prompt_ids)
    assert first.prompt_ids == trajectory.prompt_ids
    response, mask = trajectory.response_ids, trajectory.response_mask
    n1, n2 = len(first.token_ids), len(second.token_ids)
    assert response[:n1] == first.token_ids and mask[:n1] == [1] * n1
    assert response[-n2:] == second.token_ids and mask[-n2:] == [1] * n2
    # everything between the two generations (the tool turn) is context: mask 0, log-prob 0
    middle = slice(n1, len(response) - n2)
    assert set(mask[middle]) == {0}
    assert "<tool_response>" in tokenizer.decode(response[middle])
    assert trajectory.response_logprobs[middle] == [0.0] * (len(response) - n1 - n2)
    # the second generation continued from exactly the trajectory so far
    assert second.prompt_ids == trajectory.prompt_ids + response[: len(response) - n2]


async def test_tool_records_the_same_trajectory_stats_as_the_native_loop(tool_agent_run):
    """verl drops tool metrics; our tool's per-trajectory stats travel in the output's extra_fields instead."""
    from verl_search.tool.search_tool import TRAJECTORY_STATS

    _, result = tool_agent_run
    for trajectory in result.trajectories:
        assert set(TRAJECTORY_STATS) <= set(trajectory.extra_fields)
        assert trajectory.extra_fields["search_calls"] == 1
        assert trajectory.extra_fields["search_failures"] == 0
        assert trajectory.extra_fields["search_latency_s"] > 0


@pytest.mark.parametrize(
    ("limits", "dropped", "cut"),
    [
        ({}, 0, 0),  # the default limits: every result reaches the model whole
        ({"max_tool_response_length": 40}, 0, 1),  # verl cuts each result to 40 characters
        ({"response_length": 64}, 1, 1),  # the tool call fits in 64 tokens, its result does not: verl drops it
    ],
)
async def test_results_verl_cut_or_dropped_are_counted(retriever, tool_yaml, tokenizer_dir, rows, oracle, limits,
                                                       dropped, cut):  # fmt: skip
    """verl's ToolAgentLoop says nothing when it cuts a result or drops one that does not fit; the step metrics count
    both from what SearchTool noted and the trajectory's length."""
    from verl_search.monitor.step_metrics import search_step_metrics

    result = await run_rows(
        [rows("who wrote hamlet?", "tool_agent", 0)],
        policy=tool_call_policy(oracle),
        tool_config_path=tool_yaml,
        tokenizer_dir=tokenizer_dir,
        **limits,
    )
    (trajectory,) = result.trajectories
    assert trajectory.extra_fields["search_calls"] == 1
    assert ("<tool_response>" in trajectory.response_text) == (dropped == 0)
    m = search_step_metrics(
        [trajectory.extra_fields],
        response_lens=[len(trajectory.response_ids)],
        timings=[trajectory.metrics],
        max_result_chars=limits.get("max_tool_response_length", 8192),
    )
    assert m["search/results_dropped"] == dropped
    assert m["search/results_cut_share"] == cut
    assert 0 < m["search/wait_share"] < 1
