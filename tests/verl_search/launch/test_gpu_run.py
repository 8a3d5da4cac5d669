"""The GPU recipe's knobs are declared once (verl_search.launch.gpu_run, on the base both scripts share) and the
script gives verl exactly their overrides, then the engine, attention, search and trainer parts, then the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_bench.cpu_run_knobs import CpuRunKnobs
from verl_search.launch.gpu_run import GpuRunKnobs, gpu_overrides
from verl_search.launch.run_knobs import RunKnobs

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "run_scripts" / "run_qwen2.5-3b_instruct_search_multiturn.sh"


def _dry_run(env: dict[str, str], cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
    env |= {"PYTHON": sys.executable, "DRY_RUN": "1", "SKIP_PREFLIGHT": "1"}
    return subprocess.run(["bash", str(SCRIPT), *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _printed(stdout: str) -> list[str]:
    printed = stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    lines = [line.strip().rstrip("\\").strip() for line in printed.splitlines()[1:]]
    unquote = ["bash", "-c"]  # the script prints each override shell-quoted
    return [subprocess.run([*unquote, f"printf %s {line}"], capture_output=True, text=True).stdout for line in lines]


def test_the_recipe_defaults_are_the_published_ones(tmp_path):
    knobs = GpuRunKnobs.from_env({"DATA_DIR": "/d", "RUN_DIR": str(tmp_path)})
    values = dict(o.split("=", 1) for o in gpu_overrides(knobs))
    assert values["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-3B-Instruct"
    assert values["data.train_batch_size"] == "512" and values["actor_rollout_ref.actor.ppo_mini_batch_size"] == "256"
    assert values["actor_rollout_ref.rollout.n"] == "5" and float(values["actor_rollout_ref.actor.optim.lr"]) == 1e-6
    assert values["data.val_files"] == "/d/val_subset.parquet" and knobs.rollout == "sglang"
    assert knobs.experiment_name == "qwen2.5-3b-instruct-grpo-search-tool_agent"


def test_both_scripts_share_one_declaration_of_their_common_knobs():
    shared = set(RunKnobs.model_fields)
    assert shared <= set(GpuRunKnobs.model_fields) and shared <= set(CpuRunKnobs.model_fields)
    assert "max_tool_response_length" in shared and "n_gpus" not in shared and "n_ranks" not in shared


def test_a_bad_knob_is_named_before_anything_runs(tmp_path):
    with pytest.raises(match="LR=fast"):
        GpuRunKnobs.from_env({"LR": "fast"})
    done = _dry_run({"ROLLOUT": "tensorrt", "RUN_DIR": str(tmp_path / "run")}, tmp_path)
    assert done.returncode == 1 and "ROLLOUT=tensorrt" in done.stderr and "fix the knob named above" in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_script_gives_verl_the_knobs_overrides_then_its_own_parts_then_the_users(tmp_path):
    env = {"LR": "3e-6", "ROLLOUT": "vllm", "AGENT": "search_r1_agent", "N_GPUS": "2", "RUN_DIR": str(tmp_path / "r")}
    done = _dry_run(env, tmp_path, "trainer.total_epochs=2")
    assert done.returncode == 0, done.stdout + done.stderr
    printed = _printed(done.stdout)
    expected = gpu_overrides(GpuRunKnobs.from_env(env))
    assert printed[: len(expected)] == expected
    rest = printed[len(expected) :]
    assert "actor_rollout_ref.rollout.name=vllm" in rest  # the engine
    assert f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path}/r/search_tool_config.yaml" in rest
    assert rest[-1] == "trainer.total_epochs=2"
