"""The CPU run's knobs are declared once (cpu_bench.cpu_run_knobs) and mapped to verl overrides once: make train's
GRPO settings become the overrides it launches main_ppo with, and run_tiny_search_cpu.sh gives verl the same
overrides for the same knobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpu_bench.cpu_run_knobs import CpuRunKnobs, cpu_overrides, run_overrides
from cpu_bench.train.config import GRPOSettings, SearchSettings, TrainConfig
from cpu_bench.train.stages import grpo_knobs, grpo_overrides

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_scripts" / "run_tiny_search_cpu.sh"


def _values(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_grpo_settings_become_the_overrides_make_train_launches(tmp_path):
    config = TrainConfig(
        grpo=GRPOSettings(steps=5, batch_size=3, rollout_n=4, lr=2e-4, test_freq=2, temperature=0.9),
        search=SearchSettings(topk=2, max_result_chars=300, max_turns=3),
    )
    run = tmp_path / "grpo"
    values = _values(
        grpo_overrides(
            config, tmp_path / "m", tmp_path / "rl.parquet", tmp_path / "ev.parquet", tmp_path / "t.yaml", run, False
        )
    )
    assert values["actor_rollout_ref.model.path"] == str(tmp_path / "m")
    assert values["data.train_batch_size"] == "3" and values["actor_rollout_ref.actor.ppo_mini_batch_size"] == "3"
    assert values["actor_rollout_ref.rollout.n"] == "4"
    assert values["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "12"  # batch x group
    assert float(values["actor_rollout_ref.actor.optim.lr"]) == 2e-4
    assert values["trainer.total_training_steps"] == "5" and values["trainer.save_freq"] == "5"
    assert values["trainer.test_freq"] == "2" and values["trainer.resume_mode"] == "disable"
    assert values["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == "3"
    assert values["actor_rollout_ref.rollout.multi_turn.max_tool_response_length"] == "1600"  # topk x 800 > cap
    assert values["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == str(tmp_path / "t.yaml")
    assert values["actor_rollout_ref.rollout.agent.default_agent_loop"] == "search_r1_agent"
    assert values["trainer.default_local_dir"] == f"{run}/checkpoints"
    assert values["trainer.validation_data_dir"] == f"{run}/val_generations"
    assert values["trainer.v1.trainer_mode"] == "search_sync"
    assert values["trainer.val_before_train"] == "True" and values["actor_rollout_ref.rollout.temperature"] == "0.9"


def test_the_sglang_rollout_gets_the_torch_native_cpu_engine():
    knobs = CpuRunKnobs.from_env({"MODEL_PATH": "/m", "ROLLOUT": "sglang", "SGLANG_KV_TOKENS": "4096"})
    overrides = cpu_overrides(knobs)
    sglang = "+actor_rollout_ref.rollout.engine_kwargs.sglang"
    for expected in (
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.skip_tokenizer_init=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        f"{sglang}.device=cpu",
        f"{sglang}.attention_backend=torch_native",
        f"{sglang}.enable_memory_saver=False",
        f"{sglang}.max_total_tokens=4096",
    ):
        assert expected in overrides, expected


def test_a_bad_knob_is_named():
    with pytest.raises(match="ROLLOUT=trtllm"):
        CpuRunKnobs.from_env({"MODEL_PATH": "/m", "ROLLOUT": "trtllm"})
    with pytest.raises(match="set MODEL_PATH"):
        CpuRunKnobs.from_env({})


def test_empty_variables_keep_their_defaults_and_derived_defaults_follow_other_knobs(tmp_path):
    knobs = CpuRunKnobs.from_env({"MODEL_PATH": "/m", "LR": "", "AGENT": "search_r1_agent", "DATA_DIR": "/d"})
    assert knobs.lr == 1e-4 and knobs.train_data == "/d/train.parquet" and knobs.val_data == "/d/val_subset.parquet"
    assert knobs.experiment_name == "tiny-grpo-search-search_r1_agent"
    assert knobs.run_dir == f"{os.getcwd()}/runs/tiny-grpo-search-search_r1_agent"
    assert "actor_rollout_ref.rollout.name=hf_cpu" in cpu_overrides(knobs)


def _script_command(env: dict[str, str], cwd: Path) -> list[str]:
    """The overrides run_tiny_search_cpu.sh prints in a dry run (the preflight skipped: no retriever needed)."""
    env = {**os.environ, **env, "PYTHON": sys.executable, "DRY_RUN": "1", "SKIP_PREFLIGHT": "1"}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    lines = [line.strip().rstrip("\\").strip() for line in printed.splitlines()[1:]]
    return [
        subprocess.run(["bash", "-c", f"printf %s {line}"], capture_output=True, text=True).stdout for line in lines
    ]


def test_the_script_and_make_train_give_verl_the_same_overrides_for_the_same_knobs(tmp_path):
    config = TrainConfig(grpo=GRPOSettings(steps=3, batch_size=2, rollout_n=2))
    run = tmp_path / "grpo"
    knobs = grpo_knobs(config, tmp_path / "m", tmp_path / "rl.parquet", tmp_path / "ev.parquet", run)
    env = {name.upper(): "null" if v is None else str(v) for name, v in knobs.model_dump().items()}
    from_script = _script_command(env, tmp_path)
    # the script hands verl its own copy of the tool YAML (with RETRIEVER_URL); make train the data stage's
    assert from_script == run_overrides(knobs, run / "search_tool_config.yaml")
