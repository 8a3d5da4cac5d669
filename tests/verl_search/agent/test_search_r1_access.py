"""search_r1_agent with an access config (ASearcher's protocol: <search>, <access> url </access>, <answer>), its
context reserve for a last answer turn, and long turn budgets: run by verl's AgentLoopWorker on CPU against real
servers (the retrieval service with pages, the stub retriever)."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import yaml
from verl.utils.reward_score import default_compute_score

from cpu_bench.testing.scripted_policy import PolicyInput, retrieved_blocks, scripted_turns
from cpu_bench.testing.scripted_rollout import run_rows
from verl_search.agent_loop import (
    INVALID_ACTION_MESSAGE,
    RESERVE_FINAL_TURNS,
    SearchR1LoopConfig,
    parse_action,
)
from verl_search.errors import ConfigError
from verl_search.reward import INVALID_ACTION_MESSAGE_WITH_ACCESS, compute_score

REPO = Path(__file__).resolve().parents[3]
AGENT = "search_r1_agent"
HAMLET = "who wrote hamlet?"
HAMLET_URL = "https://en.wikipedia.org/wiki/Hamlet"
FINAL = SearchR1LoopConfig().final_turn_instruction
WINDOW_2 = f'<access> {{"url": "{HAMLET_URL}", "page": 2}} </access>'


@pytest.fixture
def run(tokenizer_dir, rows, tmp_path):
    """Run the Hamlet row through search_r1_agent; ``options`` go to its agent-loop YAML entry."""

    async def go(policy, *, tool_config_path, options=None, **kwargs):
        entry = yaml.safe_load((REPO / "tool_config" / "search_r1_agent.yaml").read_text())[0]
        entry.update(options or {})
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump([entry]))
        kwargs.setdefault("compute_score", default_compute_score)
        result = await run_rows(
            [rows(HAMLET, AGENT)],
            policy=policy,
            tokenizer_dir=tokenizer_dir,
            tool_config_path=tool_config_path,
            agent_loop_config_path=path,
            **kwargs,
        )
        return result.trajectories[0], result.calls

    return go


def reader(inp: PolicyInput) -> str:
    """Searches, opens the url a hit shows, follows the window hint's call, answers once it reads the author (or
    when the loop says the last turn has come)."""
    blocks = retrieved_blocks(inp.conversation, "information")
    if not blocks:
        return "<think> I need to search. </think>\n<search> hamlet </search>"
    last = blocks[-1]
    if "Shakespeare" in last:
        return "<think> The page says it. </think>\n<answer> William Shakespeare </answer>"
    if FINAL.strip() in inp.conversation:
        return "<answer> unknown </answer>"
    if hint := re.search(r"read the next with (<access> .*? </access>)", last):
        return f"<think> Read on. </think>\n{hint.group(1)}"
    if url := re.search(r"\(URL: (\S+?)\)", last):
        return f"<think> Open the page. </think>\n<access> {url.group(1)} </access>"
    return "<answer> unknown </answer>"


def assert_loop_invariants(trajectory, calls, response_length: int, tokenizer) -> list[str]:
    """Every model turn's tokens are in the response exactly, mask 1 and its log-probs; whatever lies between (what
    the loop added) is mask 0 with log-prob 0; each turn continued from exactly the response so far. Returns the
    decoded texts the loop added after each turn (and after the last, if anything)."""
    ids, mask, logprobs = trajectory.response_ids, trajectory.response_mask, trajectory.response_logprobs
    assert len(ids) == len(mask) == len(logprobs) <= response_length
    added, end = [], 0
    for call in calls:
        start = len(call.prompt_ids) - len(trajectory.prompt_ids)
        assert call.prompt_ids == trajectory.prompt_ids + ids[:start]
        if end:
            assert set(mask[end:start]) == {0} and set(logprobs[end:start]) == {0.0}
            added.append(tokenizer.decode(ids[end:start]))
        end = start + len(call.token_ids)
        assert ids[start:end] == call.token_ids
        assert mask[start:end] == [1] * len(call.token_ids)
        assert logprobs[start:end] == [-0.25] * len(call.token_ids)
    if end < len(ids):  # what the loop added after the last turn (a trajectory cut at the response length)
        assert set(mask[end:]) == {0} and set(logprobs[end:]) == {0.0}
        added.append(tokenizer.decode(ids[end:]))
    return added


async def test_search_access_next_window_answer(run, access_tool_yaml, pages, tokenizer):
    trajectory, calls = await run(reader, tool_config_path=access_tool_yaml, response_length=4096)
    assert [c.text.rsplit("\n", 1)[-1] for c in calls] == [
        "<search> hamlet </search>",
        f"<access> {HAMLET_URL} </access>",
        WINDOW_2,  # the hint's own form, copied by the model
        "<answer> William Shakespeare </answer>",
    ]
    assert set(calls[0].sampling_params["stop"]) == {"</search>", "</answer>", "</access>"}
    results, window_1, window_2 = assert_loop_invariants(trajectory, calls, 4096, tokenizer)
    assert f'Doc 1(Title: "Hamlet")(URL: {HAMLET_URL})' in results
    assert window_1.startswith("\n\n<information>[page 1 of ") and window_1.endswith("</information>\n\n")
    assert f"read the next with {WINDOW_2}]" in window_1
    assert "Shakespeare" not in window_1
    assert window_2.startswith("\n\n<information>[page 2 of ") and "William Shakespeare" in window_2
    assert trajectory.score == 1.0
    fields = trajectory.extra_fields
    assert fields["search_calls"] == 1 and fields["invalid_actions"] == 0
    assert (fields["access_calls"], fields["access_windows_read"], fields["access_pages_opened"]) == (2, 2, 1)
    assert (fields["access_failures"], fields["access_repeats"]) == (0, 0)
    assert list(fields["access_read"]) == [f"{HAMLET_URL}#1", f"{HAMLET_URL}#2"]
    assert fields["access_latency_s"] > 0 and fields["access_results_cut"] == 0


async def test_our_reward_reads_a_search_access_answer_response_as_well_formed(run, access_tool_yaml, pages):
    """The <access> turns are the model's structure (a well-formed response earns the structure score when wrong and
    keeps its full score when right), and the pages' text is never read as its answer."""
    score = partial(compute_score, structure_format_score=0.2)
    trajectory, _ = await run(reader, tool_config_path=access_tool_yaml, response_length=4096, compute_score=score)
    assert trajectory.score["score"] == 1.0 and trajectory.score["num_searches"] == 1.0
    wrong = score("searchR1_nq", trajectory.response_text, {"target": ["Marlowe"]}, trajectory.extra_fields)
    assert wrong["score"] == pytest.approx(0.2)
    told = trajectory.response_text.replace("<answer> William Shakespeare </answer>", "no answer")
    assert score("searchR1_nq", told, {"target": ["William Shakespeare"]})["answered"] == 0.0


@pytest.mark.parametrize(
    ("call", "label"),
    [
        ('<access> {"url": 42} </access>', "[access error: invalid arguments] 'url' must be a string"),
        ('<access> {"url": "x", </access>', "[access error: invalid arguments] the arguments are not valid JSON"),
        (f'<access> {{"url": "{HAMLET_URL}", "page": 99}} </access>', "[access error: invalid arguments] page 99"),
        ("<access> https://en.wikipedia.org/wiki/Nowhere </access>", "[access failed: not_found]"),
    ],
)
async def test_a_bad_access_is_labelled_in_the_native_form(run, access_tool_yaml, pages, call, label, tokenizer):
    trajectory, calls = await run(
        scripted_turns(call, "<answer> unknown </answer>"), tool_config_path=access_tool_yaml, response_length=2048
    )
    (observation,) = assert_loop_invariants(trajectory, calls, 2048, tokenizer)
    assert observation.startswith(f"\n\n<information>{label}")
    if "invalid arguments" in label:  # the model is told the form it writes, not the tool call's JSON
        assert '<access> {"url": "https://...", "page": 2} </access>' in observation
        assert "call access with" not in observation
    fields = trajectory.extra_fields
    assert (fields["access_calls"], fields["access_failures"]) == (1, 1)
    kind = "not_found" if "not_found" in label else "invalid_arguments"
    assert fields[f"access_failed_{kind}"] == 1


async def test_with_access_the_corrective_message_names_access(run, access_tool_yaml, pages, tokenizer):
    trajectory, calls = await run(
        scripted_turns("It is Shakespeare.", "<answer> William Shakespeare </answer>"),
        tool_config_path=access_tool_yaml,
        response_length=2048,
    )
    assert assert_loop_invariants(trajectory, calls, 2048, tokenizer) == [INVALID_ACTION_MESSAGE_WITH_ACCESS]
    assert "<access>" in INVALID_ACTION_MESSAGE_WITH_ACCESS
    assert list(trajectory.extra_fields["loop_messages"]) == [INVALID_ACTION_MESSAGE_WITH_ACCESS]


async def test_without_an_access_config_the_loop_is_search_r1s(run, tool_yaml, tokenizer):
    """The search-only tool YAML: no </access> stop, <access> is an invalid action with Search-R1's exact message,
    no access stats, no reserve (every turn may use what is left)."""
    trajectory, calls = await run(
        scripted_turns(f"<access> {HAMLET_URL} </access>", "<answer> William Shakespeare </answer>"),
        tool_config_path=tool_yaml,
        response_length=512,
    )
    assert calls[0].sampling_params["stop"] == ["</search>", "</answer>"]
    assert calls[0].sampling_params["max_tokens"] == 512
    assert assert_loop_invariants(trajectory, calls, 512, tokenizer) == [INVALID_ACTION_MESSAGE]
    assert trajectory.extra_fields["invalid_actions"] == 1
    assert not any(k.startswith("access_") or k == RESERVE_FINAL_TURNS for k in trajectory.extra_fields)


async def test_access_tool_name_null_keeps_access_off_with_the_two_tool_yaml(run, access_tool_yaml, pages):
    _, calls = await run(
        scripted_turns("<answer> x </answer>"), tool_config_path=access_tool_yaml, options={"access_tool_name": None}
    )
    assert calls[0].sampling_params["stop"] == ["</search>", "</answer>"]


def searcher_until_told(inp: PolicyInput) -> str:
    """Keeps searching until the loop says its searches are over, then answers from everything retrieved."""
    if FINAL.strip() in inp.conversation:
        found = "Shakespeare" in "".join(retrieved_blocks(inp.conversation, "information"))
        return f"<answer> {'William Shakespeare' if found else 'unknown'} </answer>"
    return f"<think> More. </think>\n<search> who wrote hamlet {inp.call_index} </search>"


@pytest.mark.parametrize("reserve", [0, 40])
async def test_the_reserve_turns_a_cut_trajectory_into_a_final_answer(run, tool_yaml, retriever, reserve, tokenizer):
    """Search results fill the response long before the turn budget: without a reserve the last result is cut and
    the trajectory ends unanswered; with one, the loop cuts the result to keep it, says it is the last turn and the
    model answers within it."""
    trajectory, calls = await run(
        searcher_until_told,
        tool_config_path=tool_yaml,
        options={"final_answer_tokens": reserve, "max_turns": 50},
        response_length=300,
    )
    assert assert_loop_invariants(trajectory, calls, 300, tokenizer) is not None
    fields = trajectory.extra_fields
    assert fields["search_results_cut"] == 1
    if not reserve:
        assert len(trajectory.response_ids) == 300
        assert "<answer>" not in trajectory.response_text and trajectory.score == 0.0
        assert FINAL.strip() not in trajectory.response_text
        return
    final_ids = tokenizer.encode(FINAL, add_special_tokens=False)
    for call in calls[:-1]:  # no turn but the last writes into the reserve
        assert call.sampling_params["max_tokens"] == 300 - (len(call.prompt_ids) - len(trajectory.prompt_ids)) - (
            reserve + len(final_ids)
        )
    assert calls[-1].sampling_params["max_tokens"] >= reserve
    assert trajectory.response_text.endswith("<answer> William Shakespeare </answer>")
    assert trajectory.response_text.count(FINAL.strip()) == 1
    assert list(trajectory.extra_fields["loop_messages"]) == [FINAL]
    assert fields[RESERVE_FINAL_TURNS] == 1 and fields["search_result_tokens_cut"] > 0
    assert trajectory.score == 1.0


async def test_the_reserve_holds_on_the_turn_budgets_last_turn(run, tool_yaml, retriever):
    trajectory, calls = await run(
        searcher_until_told,
        tool_config_path=tool_yaml,
        options={"final_answer_tokens": 40, "max_turns": 2},
        response_length=1024,
    )
    assert len(calls) == 2 and trajectory.score == 1.0
    assert calls[1].sampling_params["max_tokens"] >= 40
    assert trajectory.extra_fields[RESERVE_FINAL_TURNS] == 0  # the turn count, not the reserve, ended it


async def test_a_long_page_is_cut_to_keep_the_reserve(run, access_tool_yaml, pages, tokenizer):
    """With access on, a reserve is on by default; a window that does not fit is cut and counted as an access cut."""
    trajectory, calls = await run(
        reader, tool_config_path=access_tool_yaml, options={"final_answer_tokens": 32}, response_length=420
    )
    assert_loop_invariants(trajectory, calls, 420, tokenizer)
    fields = trajectory.extra_fields
    assert fields["access_results_cut"] == 1 and fields["access_result_tokens_cut"] > 0
    assert fields[RESERVE_FINAL_TURNS] == 1
    assert trajectory.response_text.rstrip().endswith("</answer>")


async def test_forty_turns_run_to_the_end(run, tool_yaml, retriever, tokenizer):
    trajectory, calls = await run(searcher_until_told, tool_config_path=tool_yaml, max_turns=40, response_length=20000)
    assert len(calls) == 40
    assert retriever.queries == [f"who wrote hamlet {i}" for i in range(39)]
    added = assert_loop_invariants(trajectory, calls, 20000, tokenizer)
    assert len(added) == 39 and FINAL in added[-1] and all(FINAL not in a for a in added[:-1])
    assert trajectory.extra_fields["search_calls"] == 39
    assert trajectory.score == 1.0


def test_long_turn_budgets_and_the_reserve_are_typed_options():
    assert SearchR1LoopConfig(max_turns=128, final_answer_tokens=512).max_turns == 128
    with pytest.raises(ValueError, match="final_answer_tokens"):
        SearchR1LoopConfig(final_answer_tokens=-1)


async def test_a_reserve_larger_than_the_response_is_a_config_error(run, tool_yaml):
    with pytest.raises(Exception) as info:
        await run(
            scripted_turns("<answer> x </answer>"),
            tool_config_path=tool_yaml,
            options={"final_answer_tokens": 512},
            response_length=256,
        )
    error = info.value
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__
    assert error is not None and "final_answer_tokens=512" in str(error)


def test_parse_action_reads_access_only_when_on():
    assert parse_action("<access> u </access><answer> a </answer>", access=True) == ("access", "u")
    assert parse_action("<access> u </access><answer> a </answer>") == ("answer", "a")
