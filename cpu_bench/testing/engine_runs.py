"""What the engine tests (verl's own vLLM and SGLang rollouts on the CPU) share: the knobs of their GRPO run from the
warm-started model, and the checks that its two trained steps searched, learnt, synced the engine's weights and
dumped trajectories of both agent loops."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path


def metrics_by_step(path: Path) -> dict[int, dict]:
    """verl's file logger's metrics, per step."""
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def retriever_requests(url: str) -> int:
    """How many requests the retriever at ``url`` has answered."""
    with urllib.request.urlopen(f"{url}/metrics") as response:
        return json.load(response)["requests_total"]


def engine_run_env(rollout: str, model: Path, data: Path, tool_yaml: Path, retriever: str) -> dict[str, str]:
    """The run script's knobs for a run of ``rollout`` from the warm-started ``model`` over rows of both loops."""
    return {
        "ROLLOUT": rollout,
        "MODEL_PATH": str(model),
        "DATA_DIR": str(data),
        "TOOL_CONFIG": str(tool_yaml),
        "RETRIEVER_URL": f"{retriever}/retrieve",
        "MAX_RESPONSE_LENGTH": "768",  # a search result is ~270 tokens
        "MAX_TOOL_RESPONSE_LENGTH": "800",
        "AGENT_CHECK": "0",  # rows mix tool_agent and search_r1_agent
        "SAVE_FREQ": "2",
        "TEST_FREQ": "2",
        "LR": "1e-4",
    }


def check_two_trained_steps(run_dir: Path, rollouts: Path, retriever: str, searched_before: int, query: str) -> list:
    """The checks of the first launch (2 steps, validation and a checkpoint at step 2); returns the dumped outputs.

    The engine came up on dummy weights (load_format=dummy): its sampling log-probs equal the actor's at both steps only
    if verl's weight sync loaded the actor's weights, as updated by step 1, into the running engine before each rollout
    (fp32 on both sides). That also proves the tool's tokens were masked out of the update: a tool token carries
    rollout log-prob 0, which the actor does not give it."""
    metrics = metrics_by_step(run_dir / "metrics-2.jsonl")
    assert sorted(metrics) == [1, 2], sorted(metrics)
    assert metrics[2]["val-core/searchR1_nq/reward/mean@1"] >= 0  # validation through our reward, at test_freq
    assert (run_dir / "checkpoints" / "global_step_2" / "actor").is_dir()
    # The model's own searches reached the retriever, at every step, and the answers differed within groups.
    assert retriever_requests(retriever) > searched_before
    for step in metrics.values():
        assert step["search/calls_per_traj/mean"] > 0, step["search/calls_per_traj/mean"]
        # no call failed in the search path; a call the sampled model wrote wrong is its own (invalid_arguments)
        failed = {k for k, v in step.items() if k.startswith("search/failed/") and v}
        assert failed <= {"search/failed/invalid_arguments"}, failed
        assert step["num_turns/max"] > 2, step["num_turns/max"]
    assert max(m["actor/grad_norm"] for m in metrics.values()) > 0
    for step in metrics.values():
        assert step["training/rollout_probs_diff_max"] < 1e-3, step["training/rollout_probs_diff_max"]

    dumped = [json.loads(line) for path in rollouts.glob("*.jsonl") for line in path.open()]
    assert len(dumped) == 2 * 4 * 2, len(dumped)  # 2 steps x 4 prompts x n=2
    outputs = [row["output"] for row in dumped]
    # tool_agent: the hermes parser turned the model's <tool_call> into our tool's call, whose result came back
    assert any("<tool_response>" in text and query in text for text in outputs)
    # search_r1_agent: the </search> stop string ended the model's turn and the loop appended the result
    assert any(f"<search> {query} </search>\n\n<information>" in text for text in outputs)
    return outputs
