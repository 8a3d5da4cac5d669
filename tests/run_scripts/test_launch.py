"""The real training and evaluation scripts with DRY_RUN=1 against a real local retriever: the broken launch and the
CPU evaluation run whole in a subprocess, the other cases leave the preflight to this process (``checked_run``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TRAIN = "run_qwen2.5-3b_instruct_search_multiturn.sh"
EVAL = "eval_search.sh"
SOURCE_TOOL_YAML = REPO / "tool_config" / "search_tool_config.yaml"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("preflight: ERROR")]


@pytest.fixture(scope="module")
def train_dry_run(checked_run, small_env, tmp_path_factory):
    """One good dry run of the training script; the tool YAML's bytes are recorded before it."""
    run_dir = tmp_path_factory.mktemp("train-run")
    source_before = SOURCE_TOOL_YAML.read_bytes()
    result = checked_run(TRAIN, **small_env(run_dir))
    return result, run_dir, source_before


def test_train_dry_run_passes_every_check(train_dry_run):
    result, _, _ = train_dry_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert error_lines(result.stderr) == []
    assert "preflight: passed" in result.stderr
    for check in ("config", "data.train_files", "data.val_files", "tools", "retriever", "reward", "agent loops"):
        assert f"OK      {check}:" in result.stderr, check
    assert "DRY_RUN=1: checks passed; not launching" in result.stdout


def test_train_dry_run_only_warns_about_missing_gpus(train_dry_run):
    result, _, _ = train_dry_run
    assert "preflight: WARNING gpus: trainer.n_gpus_per_node=1" in result.stderr


def test_train_command_carries_the_recipe(train_dry_run, data_dir):
    result, run_dir, _ = train_dry_run
    command = result.stdout.split("command:", 1)[1]
    assert "-m verl.trainer.main_ppo" in command
    for setting in (
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=6000",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={run_dir}/search_tool_config.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "reward.custom_reward_function.path=pkg://verl_search.reward",
        f"data.val_files={data_dir}/val_subset.parquet",
        "trainer.n_gpus_per_node=1",
    ):
        assert setting in command, setting


def test_train_writes_a_tool_yaml_copy_with_the_url_and_leaves_the_source_alone(train_dry_run, retriever_url):
    _, run_dir, source_before = train_dry_run
    copy = yaml.safe_load((run_dir / "search_tool_config.yaml").read_text())
    assert copy["tools"][0]["config"]["retrieval_service_url"] == retriever_url
    assert copy["tools"][0]["class_name"] == "verl_search.SearchTool"
    assert SOURCE_TOOL_YAML.read_bytes() == source_before


def test_broken_launch_names_every_problem_and_does_not_launch(run_script, small_env, closed_port_url, tmp_path):
    """A bad override, a missing data file and an unreachable retriever: one error line each, exit 1."""
    env = small_env(tmp_path / "run")
    missing = tmp_path / "no" / "train.parquet"
    env.update(TRAIN_DATA=str(missing), RETRIEVER_URL=closed_port_url)
    result = run_script(TRAIN, "actor_rollout_ref.rollout.nonexistent_key=1", **env)
    assert result.returncode == 1
    errors = error_lines(result.stderr)
    assert any("unknown config key 'actor_rollout_ref.rollout.nonexistent_key'" in line for line in errors), errors
    assert any(f"{missing}: no such file" in line for line in errors), errors
    assert any(f"retriever {closed_port_url} is unreachable" in line for line in errors), errors
    assert len(errors) == 3, errors
    assert "command:" not in result.stdout
    assert "preflight failed" in result.stderr


def test_train_rejects_an_unknown_agent_before_doing_anything(run_script, small_env, tmp_path):
    result = run_script(TRAIN, AGENT="react_agent", **small_env(tmp_path / "run"))
    assert result.returncode == 1
    assert "AGENT=react_agent: choose tool_agent or search_r1_agent" in result.stderr
    assert not (tmp_path / "run").exists()


def test_eval_dry_run_loads_the_latest_checkpoint_greedily(checked_run, small_env, data_dir, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "global_step_7" / "actor").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("7\n")
    env = small_env(tmp_path / "eval")
    env.update(CHECKPOINT=str(checkpoints), TRAIN_BATCH_SIZE="4")
    result = checked_run(EVAL, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"OK      checkpoint: starts from {checkpoints}/global_step_7" in result.stderr
    command = result.stdout.split("command:", 1)[1]
    for setting in (
        "trainer.val_only=True",
        "trainer.val_before_train=True",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoints}/global_step_7",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        f"trainer.validation_data_dir={tmp_path}/eval/generations",
        f"data.val_files={data_dir}/val_subset.parquet",
    ):
        assert setting in command, setting
    assert f"-m verl_search.report {tmp_path}/eval/generations" in result.stdout
    # the dumps carry no data_source: the printed report command must name the evaluated data
    report = f"-m verl_search.report {tmp_path}/eval/generations --data {data_dir}/val_subset.parquet"
    assert report in result.stdout


def test_eval_rejects_a_checkpoint_that_is_neither_verl_nor_hf(run_script, small_env, tmp_path):
    (tmp_path / "junk").mkdir()
    result = run_script(EVAL, CHECKPOINT=str(tmp_path / "junk"), **small_env(tmp_path / "eval"))
    assert result.returncode == 1
    assert "neither a verl checkpoint (no actor/) nor a Hugging Face model (no config.json)" in result.stderr


def test_train_dry_run_names_the_engine_and_the_attention_it_chose(train_dry_run):
    """No FlashAttention-2 on this machine: the script picks sdpa without padding removal, and the preflight reports
    engine and attention."""
    result, _, _ = train_dry_run
    command = result.stdout.split("command:", 1)[1]
    assert "+actor_rollout_ref.model.override_config.attn_implementation=sdpa" in command
    assert "actor_rollout_ref.model.use_remove_padding=False" in command
    assert "skip_tokenizer_init" not in command  # tool_agent stops at end-of-turn tokens only
    chosen = "rollout engine: sglang; actor attention: sdpa, without padding removal (no FlashAttention-2"
    assert chosen in result.stderr
    assert "preflight: OK      attention: sdpa, padded batches" in result.stderr
    assert "preflight: WARNING engine install: rollout engine sglang does not import" in result.stderr


def test_eval_on_the_cpu_is_the_cpu_run_in_validation_only_mode(run_script, small_env, data_dir, tmp_path):
    """DEVICE=cpu: run_tiny_search_cpu.sh's knobs and CPU overrides, then the evaluation's, which the preflight (it
    composes verl's config) sees win: it refuses val_only without val_before_train."""
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "global_step_3" / "actor").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("3\n")
    env = small_env(tmp_path / "eval")
    env.update(DEVICE="cpu", ROLLOUT="hf_cpu", MODEL_PATH="Org/base-model", CHECKPOINT=str(checkpoints))
    result = run_script(EVAL, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight: passed" in result.stderr
    assert "evaluating on the CPU: run_tiny_search_cpu.sh, validation only (ROLLOUT=hf_cpu)" in result.stdout
    command = result.stdout.split("command:", 1)[1]
    for setting in (
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=hf_cpu",
        "actor_rollout_ref.model.path=Org/base-model",
        "trainer.val_only=True",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoints}/global_step_3",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        f"trainer.validation_data_dir={tmp_path}/eval/generations",
        f"data.val_files={data_dir}/val_subset.parquet",
        f"data.train_files={data_dir}/val_subset.parquet",
    ):
        assert setting in command, setting
    # the knobs' own override comes first and the evaluation's later one wins
    assert command.index("trainer.val_before_train=False") < command.index("trainer.val_before_train=True")


def test_eval_on_the_cpu_refuses_sglang_and_names_the_engines_that_run(run_script, small_env, tmp_path):
    env = small_env(tmp_path / "eval")
    result = run_script(EVAL, DEVICE="cpu", ROLLOUT="sglang", MODEL_PATH=str(tmp_path), **env)
    assert result.returncode == 1
    assert "ROLLOUT=sglang: SGLang has no CPU build on the package index (README)" in result.stderr
    result = run_script(EVAL, DEVICE="tpu", **env)
    assert result.returncode == 1 and "DEVICE=tpu: choose cuda or cpu" in result.stderr
