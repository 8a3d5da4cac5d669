"""verl's real trainer (``python -m verl.trainer.main_ppo``) on the CPU: GRPO on a tiny Qwen2 with our search tool,
both agent loops, the real retriever and our reward; validation, a checkpoint, and (``make test-all``; the vLLM and
SGLang suites of ``.ci/run`` resume through verl on every submission) a resumed run.

What is forced, and why (the test kit's opening policy for the hf_cpu rollout server, named by
``engine_kwargs.hf_cpu.opening_policy``, see cpu_bench/testing/forced_prefix.py): a random model never searches nor
answers, so every 2nd first turn opens with a real search call on the question and every turn after a search result
opens with ``<answer> Paris </answer>``; the rest is the model's own sampling. The policy also records the server's
events (weight fingerprints per update).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from cpu_bench.testing.engine_runs import metrics_by_step

REPO = Path(__file__).resolve().parents[3]
FORCED = "path:cpu_bench.testing.forced_prefix.ForcedOpenings,search_every:2,answer:Paris,answer_every:1"


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("resume", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["train", "and-resume"])
def test_grpo_with_search_trains_validates_checkpoints_and_resumes(
    tmp_path, tiny_model, real_retriever, mixed_data, short_results_tool_yaml, launch_cpu_run, resume
):
    run_dir, records = tmp_path / "run", tmp_path / "records"
    env = {
        "MODEL_PATH": str(tiny_model),
        "DATA_DIR": str(mixed_data),
        "TOOL_CONFIG": str(short_results_tool_yaml),
        "RETRIEVER_URL": f"{real_retriever}/retrieve",
        "MAX_TOOL_RESPONSE_LENGTH": "800",
        "AGENT_CHECK": "0",  # rows mix tool_agent and search_r1_agent
        "SAVE_FREQ": "2",
        "TEST_FREQ": "2",
    }
    options = (
        "+actor_rollout_ref.rollout.engine_kwargs.hf_cpu="
        f"{{max_tokens_per_turn:48,opening_policy:{{{FORCED},record_dir:{records}}}}}"
    )
    first = launch_cpu_run(run_dir, env, 2, options, f"trainer.rollout_data_dir={tmp_path / 'rollouts'}")
    assert first.returncode == 0, first.stdout[-4000:]

    metrics = metrics_by_step(run_dir / "metrics-2.jsonl")
    assert sorted(metrics) == [1, 2]
    assert max(m["actor/grad_norm"] for m in metrics.values()) > 0  # forced answers give GRPO non-zero advantages
    assert metrics[2]["val-core/searchR1_nq/reward/mean@1"] >= 0  # validation through our reward, at test_freq
    assert "val-aux/searchR1_nq/num_searches/mean@1" in metrics[2]  # search statistics reach the logger
    # ... at every training step too (trainer_mode search_sync, verl_search.monitor), and they describe these rollouts
    for step in metrics.values():
        assert step["search/calls_per_traj/mean"] > 0 and step["search/latency_s/p50"] > 0
        assert 0 <= step["search/joined_share"] <= step["search/reused_share"] <= 1
        assert 0 <= step["search/answered_share"] <= 1 and 0 <= step["search/wait_share"] <= 1
        assert step["search/alarm_steps"] >= 0
        # results verl cut or dropped (from the TransferQueue's response lengths; none dropped at these lengths)
        assert 0 <= step["search/results_cut_share"] <= 1 and step["search/results_dropped"] >= 0
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()

    with urllib.request.urlopen(f"{real_retriever}/metrics") as response:
        assert json.load(response)["requests_total"] > 0

    # Both agent loops searched: the trained responses hold hermes tool results and Search-R1 information blocks.
    dumped = [json.loads(line) for path in (tmp_path / "rollouts").glob("*.jsonl") for line in path.open()]
    outputs = " ".join(row["output"] for row in dumped)
    assert "<tool_response>" in outputs and "<information>" in outputs
    # Tool tokens are masked out of the trained batch: verl compares rollout and actor log-probs over response_mask;
    # a tool token carries rollout log-prob 0 (p=1) while the random actor gives it p~1/1700, so one unmasked tool
    # token would push this to ~1. Every turn was a tool turn's neighbour here (num_turns > 2 in each step).
    for step in metrics.values():
        assert step["num_turns/max"] > 2
        assert step["training/rollout_probs_diff_max"] < 0.01
        assert step["search/unmasked_results_share"] == 0  # the check make gpu-smoke reads (bf16 blurs the above)

    # The update reached the sampler: a new weight fingerprint after each step.
    updates = [r for r in _records(records) if r["event"] == "update_weights"]
    by_step = {r["global_steps"]: r["fingerprint"] for r in updates}
    assert by_step[1] != by_step[2]
    if not resume:
        return

    # The resume is verl's: the checks already passed on the first launch (the preflight's own resume checks have
    # their tests), so the second launch goes straight to the trainer.
    second = launch_cpu_run(run_dir, {**env, "SKIP_PREFLIGHT": "1"}, 3, options)
    assert second.returncode == 0, second.stdout[-4000:]
    # resumed from global_step_2, trained step 3 only
    assert sorted(metrics_by_step(run_dir / "metrics-3.jsonl")) == [3]
