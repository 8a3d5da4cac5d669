"""verl's real trainer with verl's own SGLang rollout on the CPU (``ROLLOUT=sglang``: ``rollout.name=sglang``, its
async server in a Ray actor, SGLang's scheduler processes on the torch-native path, the agent-loop workers and the
weight sync): GRPO on a tiny Qwen2 with both agent loops, our tool against the real retriever and our reward;
validation, a checkpoint, and a resumed run.

Nothing forces the engine's output. The model is warm-started (conftest ``warm_engine_model``) to write a search for
"capital of france" in both protocols and then answer "Paris" or "Lyon"; SGLang samples everything, verl's hermes
parser turns the ``<tool_call>`` into our tool's call, SGLang's stop strings end a native turn at ``</search>``, and
our EM reward tells the two answers apart, which gives GRPO non-zero advantages. SGLang's own request log (its
``--log-requests`` JSON records) shows that it served every turn.

Needs the CPU SGLang route (``make install-sglang-cpu``; ``make test-sglang-cpu`` runs it); skipped without it.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

QUERY = "capital of france"  # what the warm start taught the model to search (conftest)

pytestmark = [pytest.mark.slow, pytest.mark.sglang_cpu]


def _metrics(path: Path) -> dict[int, dict]:
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def _requests_total(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics") as response:
        return json.load(response)["requests_total"]


FINISHED = '"event": "request.finished"'
#: SGLang logs every generate request it finishes, as JSON with its output, to its server's stdout (in the run's log)
REQUEST_LOG = [
    f"+actor_rollout_ref.rollout.engine_kwargs.sglang.{key}={value}"
    for key, value in (("log_requests", True), ("log_requests_level", 3), ("log_requests_format", "json"))
]


def _served(output: str) -> list[dict]:
    """SGLang's records of the generate requests it finished, from the run's output."""
    return [json.loads(line[line.index("{") :]) for line in output.splitlines() if FINISHED in line]


def test_grpo_with_verls_sglang_rollout_searches_trains_validates_checkpoints_and_resumes(
    tmp_path, warm_engine_model, real_retriever, mixed_data, short_results_tool_yaml, launch_cpu_run
):
    run_dir, rollouts = tmp_path / "run", tmp_path / "rollouts"
    env = {
        "ROLLOUT": "sglang",
        "MODEL_PATH": str(warm_engine_model),
        "DATA_DIR": str(mixed_data),
        "TOOL_CONFIG": str(short_results_tool_yaml),
        "RETRIEVER_URL": f"{real_retriever}/retrieve",
        "MAX_RESPONSE_LENGTH": "768",  # a search result is ~270 tokens
        "MAX_TOOL_RESPONSE_LENGTH": "800",
        "AGENT_CHECK": "0",  # rows mix tool_agent and search_r1_agent
        "SAVE_FREQ": "2",
        "TEST_FREQ": "2",
        "LR": "1e-4",
        "RAY_DEDUP_LOGS": "0",  # every line of SGLang's request log reaches the run's output
    }
    searched_before = _requests_total(real_retriever)
    overrides = [f"trainer.rollout_data_dir={rollouts}", *REQUEST_LOG]
    first = launch_cpu_run(run_dir, env, 2, *overrides, timeout=600)
    assert first.returncode == 0, first.stdout[-4000:]
    # the preflight ran its SGLang checks for real: the engine imports, and the versions are the CPU lock's
    assert "engine install: sglang 0.5.12 imports" in first.stdout
    assert "sglang 0.5.12 as in cpu-sglang-py3.11.txt" in first.stdout, first.stdout[:4000]

    metrics = _metrics(run_dir / "metrics-2.jsonl")
    assert sorted(metrics) == [1, 2]
    assert metrics[2]["val-core/searchR1_nq/reward/mean@1"] >= 0  # validation through our reward, at test_freq
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    # The model's own searches reached the retriever, at every step, and the answers differed within groups.
    assert _requests_total(real_retriever) > searched_before
    for step in metrics.values():
        assert step["search/calls_per_traj/mean"] > 0
        failed = {k for k, v in step.items() if k.startswith("search/failed/") and v}
        assert failed <= {"search/failed/invalid_arguments"}, failed
        assert step["num_turns/max"] > 2
    assert max(m["actor/grad_norm"] for m in metrics.values()) > 0
    # SGLang came up on dummy weights (load_format=dummy): its sampling log-probs equal the actor's at both steps only
    # if verl's weight sync loaded the actor's weights, as updated by step 1, into the running engine before each
    # rollout (through verl_search.cpu.sglang_gaps on a CPU; fp32 on both sides). It also proves the tool's tokens were
    # masked out of the update: a tool token carries rollout log-prob 0, which the actor does not give it.
    for step in metrics.values():
        assert step["training/rollout_probs_diff_max"] < 1e-3

    dumped = [json.loads(line) for path in rollouts.glob("*.jsonl") for line in path.open()]
    assert len(dumped) == 2 * 4 * 2  # 2 steps x 4 prompts x n=2
    outputs = [row["output"] for row in dumped]
    # tool_agent: the hermes parser turned the model's <tool_call> into our tool's call, whose result came back
    assert any("<tool_response>" in text and QUERY in text for text in outputs)
    # search_r1_agent: SGLang's stop string ended the model's turn at </search> and the loop appended the result
    assert any(f"<search> {QUERY} </search>\n\n<information>" in text for text in outputs)

    # SGLang's own log: it finished a generate request for the first turn of every training and validation trajectory,
    # and one for each turn after a search result; every text it generated is in a trajectory verl kept.
    validated = [json.loads(line)["output"] for line in (run_dir / "val_generations" / "2.jsonl").open()]
    kept = outputs + validated
    texts = [record["out"]["text"] for record in _served(first.stdout)]
    assert len(texts) > len(kept)  # at least one turn a trajectory, and more where the model searched
    assert all(any(text in output for output in kept) for text in texts if text.strip())
    for output in kept:  # each trajectory opens with a turn SGLang generated
        assert any(output.startswith(text) for text in texts if text.strip()), output[:300]

    second = launch_cpu_run(run_dir, env, 3, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert sorted(_metrics(run_dir / "metrics-3.jsonl")) == [3]  # resumed from global_step_2, trained step 3 only
    assert _metrics(run_dir / "metrics-3.jsonl")[3]["training/rollout_probs_diff_max"] < 1e-3
