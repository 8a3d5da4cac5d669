"""make train's GRPO stages launch run_tiny_search_cpu.sh: the stage's settings become the script's knobs and its own
overrides follow the script's recipe, and nothing in the user's shell changes a stage."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from cpu_bench.train.config import GRPOSettings, SearchSettings, TrainConfig
from cpu_bench.train.processes import child_env
from cpu_bench.train.stages import CPU_SCRIPT, grpo_env, grpo_overrides


def _printed_by_the_stage(config: TrainConfig, tmp_path: Path, val_only: bool = False) -> dict[str, str]:
    """The overrides the stage's script prints in a dry run (the preflight skipped: no retriever is needed)."""
    run = tmp_path / "grpo"
    tool_yaml = tmp_path / "t.yaml"
    tool_yaml.write_text("tools:\n- class_name: x\n  config: {retrieval_service_url: http://h:1/retrieve}\n")
    stage_env = grpo_env(config, tmp_path / "m", tmp_path / "rl.parquet", tmp_path / "ev.parquet", tool_yaml, run)
    env = child_env(stage_env) | {"DRY_RUN": "1", "SKIP_PREFLIGHT": "1"}
    command = ["bash", str(CPU_SCRIPT), *grpo_overrides(config, val_only)]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    words = shlex.split(done.stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0].replace("\\\n", " "))
    return dict(o.split("=", 1) for o in words[words.index("verl.trainer.main_ppo") + 1 :])


def test_grpo_settings_reach_verl_through_the_cpu_script(tmp_path):
    config = TrainConfig(
        grpo=GRPOSettings(steps=5, batch_size=3, rollout_n=4, lr=2e-4, test_freq=2, temperature=0.9),
        search=SearchSettings(topk=2, max_result_chars=300, max_turns=3),
    )
    values = _printed_by_the_stage(config, tmp_path)
    run = tmp_path / "grpo"
    assert values["actor_rollout_ref.model.path"] == str(tmp_path / "m")
    assert values["data.train_batch_size"] == "3" and values["actor_rollout_ref.actor.ppo_mini_batch_size"] == "3"
    assert values["actor_rollout_ref.rollout.n"] == "4"
    assert values["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "12"  # batch x group
    assert float(values["actor_rollout_ref.actor.optim.lr"]) == 2e-4
    assert values["trainer.total_training_steps"] == "5" and values["trainer.save_freq"] == "5"
    assert values["trainer.test_freq"] == "2" and values["trainer.resume_mode"] == "disable"
    assert values["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == "3"
    assert values["actor_rollout_ref.rollout.multi_turn.max_tool_response_length"] == "1600"  # topk x 800 > cap
    # the script's copy of the data stage's tool YAML, with the URL the data stage wrote in it
    assert values["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == f"{run}/search_tool_config.yaml"
    assert "retrieval_service_url: http://h:1/retrieve" in (run / "search_tool_config.yaml").read_text()
    assert values["actor_rollout_ref.rollout.agent.default_agent_loop"] == "search_r1_agent"
    assert values["trainer.default_local_dir"] == f"{run}/checkpoints"
    assert values["trainer.validation_data_dir"] == f"{run}/val_generations"
    assert values["trainer.v1.trainer_mode"] == "search_sync"
    # the stage's own overrides come after the recipe's, so they win
    assert values["trainer.val_before_train"] == "True" and values["actor_rollout_ref.rollout.temperature"] == "0.9"
    assert values["trainer.val_only"] == "False"


def test_the_users_shell_never_changes_a_stage(tmp_path, monkeypatch: pytest.MonkeyPatch):
    for name, value in {"TRAINER": "fully_async", "LR": "5", "N_RANKS": "4", "AGENT_CHECK": "0"}.items():
        monkeypatch.setenv(name, value)
    values = _printed_by_the_stage(TrainConfig(), tmp_path, val_only=True)
    assert values["trainer.v1.trainer_mode"] == "search_sync" and values["trainer.n_gpus_per_node"] == "1"
    assert float(values["actor_rollout_ref.actor.optim.lr"]) == TrainConfig().grpo.lr
    assert values["trainer.val_only"] == "True"
    assert os.environ["TRAINER"] == "fully_async"  # only the stage's environment is cleared
