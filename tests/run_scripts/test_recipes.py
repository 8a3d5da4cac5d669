"""Each run script is its recipe: every knob is a ``${VAR:-default}`` in it, every override it prints is written in it
except the few Python adds (attention, trainer mode, logical GPUs, context length, resume), the user's come last, a bad
knob is named before anything is written, and one Python process runs before verl."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from verl_search.errors import KnobError
from verl_search.launch.cpu_recipe import CpuKnobs
from verl_search.launch.gpu_recipe import GpuKnobs

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "run_scripts"
GPU = "run_qwen2.5-3b_instruct_search_multiturn.sh"
CPU = "run_tiny_search_cpu.sh"
#: per script: its knobs model, the knobs a dry run needs, the recipe with more of its branches
RECIPES: dict[str, tuple[type[BaseModel], dict[str, str], dict[str, str]]] = {
    GPU: (GpuKnobs, {}, {"AGENT": "search_r1_agent", "DYNAMIC_BSZ": "1"}),
    CPU: (CpuKnobs, {"MODEL_PATH": "/m"}, {"AGENT": "search_r1_agent", "ROLLOUT": "sglang"}),
}
#: the overrides Python adds (the attention probe, the trainer mode, logical GPUs, the context length, a resume)
DERIVED = (
    "+actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.model.use_remove_padding",
    "trainer.v1.",
    "trainer.resume_",
    "+ray_kwargs.ray_init.num_gpus",
    "actor_rollout_ref.rollout.max_model_len",
)


def _dry_run(
    script: str, env: dict[str, str], cwd: Path, *extra: str, python: str = sys.executable
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | RECIPES[script][1] | env
    env = {"DRY_RUN": "1", "SKIP_PREFLIGHT": "1", **env, "PYTHON": python}
    if "sglang" in env.values():  # the script checks that the engine imports: a stand-in package does
        (cwd / "fake" / "sglang").mkdir(parents=True, exist_ok=True)
        (cwd / "fake" / "sglang" / "__init__.py").touch()
        env["PYTHONPATH"] = str(cwd / "fake")
    command = ["bash", str(SCRIPTS / script), *extra]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("script", RECIPES)
def test_every_knob_has_its_default_in_the_script(script):
    text = (SCRIPTS / script).read_text()
    for name in RECIPES[script][0].model_fields:
        knob = name.upper()
        assert re.search(rf'^{knob}="(\$\(vs_\w+ )?"?\$\{{{knob}:-', text, re.M), f"{knob} has no default in the script"


@pytest.mark.parametrize("script", RECIPES)
def test_every_printed_override_but_the_derived_ones_is_written_in_the_script(tmp_path, script, overrides_of):
    text = (SCRIPTS / script).read_text().replace('"$multi_turn"', "actor_rollout_ref.rollout.multi_turn")
    text = text.replace('"$actor"', "actor_rollout_ref.actor").replace('"$rollout"', "actor_rollout_ref.rollout")
    text = text.replace('"$ref"', "actor_rollout_ref.ref")
    for env in ({}, RECIPES[script][2]):
        done = _dry_run(script, {"RUN_DIR": str(tmp_path / "run"), **env}, tmp_path)
        assert done.returncode == 0, done.stderr
        for override in overrides_of(done.stdout):
            key = override.split("=", 1)[0]
            if not key.startswith(DERIVED):
                assert f"{key}=" in text, f"{override} is not written in the script"


@pytest.mark.parametrize("script", RECIPES)
def test_the_users_overrides_come_last_after_what_python_adds(tmp_path, script, overrides_of):
    env = {"TRAINER": "fully_async", "RUN_DIR": str(tmp_path / "r"), "N_GPUS": "4", "ROLLOUT_GPUS": "4"}
    done = _dry_run(script, env, tmp_path, "trainer.total_epochs=2", "trainer.v1.trainer_mode=search_sync")
    assert done.returncode == 0, done.stderr
    printed = overrides_of(done.stdout)
    assert printed[-2:] == ["trainer.total_epochs=2", "trainer.v1.trainer_mode=search_sync"]
    assert "trainer.v1.trainer_mode=search_separate_async" in printed[:-2]
    assert f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path}/r/search_tool_config.yaml" in printed
    assert (tmp_path / "r" / "search_tool_config.yaml").is_file()


@pytest.mark.parametrize(
    ("script", "env", "named"),
    [
        (GPU, {"ROLLOUT": "tensorrt"}, "ROLLOUT=tensorrt"),
        (GPU, {"LR": "fast"}, "LR=fast"),
        (GPU, {"SHUFFLE": "yes"}, "SHUFFLE=yes"),
        (CPU, {"ROLLOUT": "trtllm"}, "ROLLOUT=trtllm"),
        (CPU, {"N_RANKS": "0"}, "N_RANKS=0"),
        (CPU, {"TOTAL_STEPS": "some"}, "TOTAL_STEPS=some"),
        (CPU, {"AGENT_CHECK": "2"}, "AGENT_CHECK=2"),
    ],
)
def test_a_bad_knob_is_named_before_anything_is_written(tmp_path, script, env, named):
    done = _dry_run(script, {**env, "RUN_DIR": str(tmp_path / "run")}, tmp_path)
    assert done.returncode == 1 and named in done.stderr and "fix the knob named above" in done.stderr
    assert "command:" not in done.stdout and not (tmp_path / "run").exists()


@pytest.mark.parametrize("knobs", [GpuKnobs, CpuKnobs])
def test_knobs_the_script_did_not_set_are_named(knobs):
    with pytest.raises(KnobError, match="MODEL_PATH.* not set: run the script"):
        knobs.from_env({})


def test_the_cpu_run_needs_a_model(tmp_path):
    done = _dry_run(CPU, {"MODEL_PATH": "", "RUN_DIR": str(tmp_path / "run")}, tmp_path)
    assert done.returncode == 1 and "set MODEL_PATH to a model folder" in done.stderr
    assert not (tmp_path / "run").exists()


def _counting_python(tmp_path: Path) -> tuple[str, Path]:
    """A PYTHON that logs each start (its arguments) and then runs this interpreter."""
    log, wrapper = tmp_path / "starts.log", tmp_path / "python"
    wrapper.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), log


def test_one_python_process_runs_before_verl(tmp_path, small_env):
    python, log = _counting_python(tmp_path)
    env = {**small_env(tmp_path / "run"), "SKIP_PREFLIGHT": "0", "WANDB_MODE": "disabled"}
    done = _dry_run(GPU, env, tmp_path, python=python)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preflight: passed" in done.stderr
    starts = log.read_text().splitlines()
    assert len(starts) == 1 and starts[0].startswith("-m verl_search.launch.prepare gpu"), starts


def test_the_cpu_script_starts_one_python_process_before_verl(tmp_path):
    python, log = _counting_python(tmp_path)
    done = _dry_run(CPU, {"RUN_DIR": str(tmp_path / "run")}, tmp_path, python=python)
    assert done.returncode == 0, done.stderr[-3000:]
    starts = log.read_text().splitlines()
    assert len(starts) == 1 and starts[0].startswith("-m verl_search.launch.prepare cpu"), starts


def test_the_cpu_engines_context_is_prompt_plus_response_and_separate_pools_get_logical_gpus(tmp_path, overrides_of):
    env = {"RUN_DIR": str(tmp_path / "r"), "ROLLOUT": "sglang", "MAX_PROMPT_LENGTH": "256", "N_RANKS": "2"}
    done = _dry_run(CPU, env | {"TRAINER": "fully_async", "ROLLOUT_GPUS": "3"}, tmp_path)
    assert done.returncode == 0, done.stderr
    printed = overrides_of(done.stdout)
    assert "actor_rollout_ref.rollout.max_model_len=768" in printed
    assert "+ray_kwargs.ray_init.num_gpus=5" in printed  # the trainer's 2 ranks and the rollout pool's 3
    done = _dry_run(CPU, {"RUN_DIR": str(tmp_path / "r")}, tmp_path)
    printed = overrides_of(done.stdout)
    assert "+ray_kwargs.ray_init.num_gpus=1" in printed
    assert not any(o.startswith("actor_rollout_ref.rollout.max_model_len=") for o in printed)  # hf_cpu has none


def _recipe_lines(script: str) -> dict[str, str]:
    """The ``key=value`` lines of a script's ``RECIPE=(...)`` array, its ``"$actor"``-style prefixes spelt out."""
    text = (SCRIPTS / script).read_text()
    for short, key in (
        ("multi_turn", "rollout.multi_turn"),
        ("actor", "actor"),
        ("ref", "ref"),
        ("rollout", "rollout"),
    ):
        text = text.replace(f'"${short}"', f"actor_rollout_ref.{key}")
    body = text.split("\nRECIPE=(\n", 1)[1].split("\n)\n", 1)[0]
    lines = [line.strip() for line in body.splitlines() if "=" in line and not line.strip().startswith("#")]
    return dict(line.split("=", 1) for line in lines)


#: the lines the CPU recipe writes differently on purpose: no offload, no checkpointing and one node on a CPU, and its
#: own names for the micro-batch and the ranks
CPU_DIFFERS = {
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
}


#: the lines the evaluation writes differently on purpose: no training, so no KL loss, offloaded, one batch
EVAL_DIFFERS = {
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
}


@pytest.mark.parametrize(("other", "differs", "least"), [(CPU, CPU_DIFFERS, 40), ("eval_search.sh", EVAL_DIFFERS, 30)])
def test_the_lines_the_recipes_share_say_the_same(other, differs, least):
    """Each script writes its whole recipe, so the lines it shares with the GPU script are written twice: they must
    not drift apart."""
    gpu, theirs = _recipe_lines(GPU), _recipe_lines(other)
    shared = set(gpu) & set(theirs)
    assert len(shared) >= least and differs <= shared
    drifted = {key: (gpu[key], theirs[key]) for key in shared - differs if gpu[key] != theirs[key]}
    assert not drifted, drifted
