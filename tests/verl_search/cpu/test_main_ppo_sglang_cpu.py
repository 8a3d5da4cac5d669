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

import pytest

from cpu_bench.testing.engine_runs import check_two_trained_steps, engine_run_env, metrics_by_step, retriever_requests

QUERY = "capital of france"  # what the warm start taught the model to search (conftest)

pytestmark = [pytest.mark.slow, pytest.mark.sglang_cpu]


FINISHED = '"event": "request.finished"'
#: SGLang logs every generate request it finishes, as JSON with its output, to its server's stdout (in the run's log)
REQUEST_LOG = [
    f"+actor_rollout_ref.rollout.engine_kwargs.sglang.{key}={value}"
    for key, value in (("log_requests", True), ("log_requests_level", 3), ("log_requests_format", "json"))
]


def _holds(output: str, text: str) -> bool:
    """Whether a kept trajectory holds a generated text: whole, or cut at the trajectory's end (verl stops a
    response at ``data.max_response_length`` even when the engine generated more of that turn)."""
    if text in output:
        return True
    start = output.find(text[:40])
    return start >= 0 and text.startswith(output[start:])


def _served(output: str) -> list[dict]:
    """SGLang's records of the generate requests it finished, from the run's output."""
    return [json.loads(line[line.index("{") :]) for line in output.splitlines() if FINISHED in line]


def test_grpo_with_verls_sglang_rollout_searches_trains_validates_checkpoints_and_resumes(
    tmp_path, warm_engine_model, real_retriever, mixed_data, short_results_tool_yaml, launch_cpu_run
):
    run_dir, rollouts = tmp_path / "run", tmp_path / "rollouts"
    env = engine_run_env("sglang", warm_engine_model, mixed_data, short_results_tool_yaml, real_retriever)
    env["RAY_DEDUP_LOGS"] = "0"  # every line of SGLang's request log reaches the run's output
    searched_before = retriever_requests(real_retriever)
    overrides = [f"trainer.rollout_data_dir={rollouts}", *REQUEST_LOG]
    first = launch_cpu_run(run_dir, env, 2, *overrides, timeout=600)
    assert first.returncode == 0, first.stdout[-4000:]
    # the preflight ran its SGLang checks for real: the engine imports, and the versions are the CPU lock's
    assert "engine install: sglang 0.5.12 imports" in first.stdout
    assert "sglang 0.5.12 as in cpu-sglang-py3.11.txt" in first.stdout, first.stdout[:4000]
    # searches, learning, weight sync into SGLang (through verl_search.cpu.sglang_gaps), tool tokens out of the loss,
    # and the hermes parser and SGLang's </search> stop string in the dumped trajectories
    outputs = check_two_trained_steps(run_dir, rollouts, real_retriever, searched_before, QUERY)

    # SGLang's own log: it finished a generate request for the first turn of every training and validation trajectory,
    # and one for each turn after a search result; every text it generated is in a trajectory verl kept (the end of
    # a trajectory's last turn cut where the response budget ran out).
    validated = [json.loads(line)["output"] for line in (run_dir / "val_generations" / "2.jsonl").open()]
    kept = outputs + validated
    texts = [record["out"]["text"] for record in _served(first.stdout)]
    assert len(texts) > len(kept)  # at least one turn a trajectory, and more where the model searched
    missing = [text[:200] for text in texts if text.strip() and not any(_holds(output, text) for output in kept)]
    assert not missing, missing
    for output in kept:  # each trajectory opens with a turn SGLang generated
        assert any(output.startswith(text) for text in texts if text.strip()), output[:300]

    second = launch_cpu_run(run_dir, env, 3, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    resumed = metrics_by_step(run_dir / "metrics-3.jsonl")
    assert sorted(resumed) == [3]  # resumed from global_step_2, trained step 3 only
    assert resumed[3]["training/rollout_probs_diff_max"] < 1e-3
