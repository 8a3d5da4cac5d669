"""The GPU script is the recipe: every knob is a ``${VAR:-default}`` in it, every override it prints is written in it
except the few Python adds (attention, trainer mode, resume), the user's come last, a bad knob is named before anything
is written, and one Python process runs before verl."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from verl_search.errors import KnobError
from verl_search.launch.gpu_recipe import GpuKnobs

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_scripts" / "run_qwen2.5-3b_instruct_search_multiturn.sh"
#: the overrides Python adds (the attention probe, the trainer mode, a resume)
DERIVED = (
    "+actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.model.use_remove_padding",
    "trainer.v1.",
    "trainer.resume_",
)


def _dry_run(env: dict[str, str], cwd: Path, *extra: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
    env = {"DRY_RUN": "1", "SKIP_PREFLIGHT": "1", **env, "PYTHON": python}
    return subprocess.run(["bash", str(SCRIPT), *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def _printed(stdout: str) -> list[str]:
    command = stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    words = shlex.split(command.replace("\\\n", " "))
    return words[words.index("verl.trainer.main_ppo") + 1 :]


def test_every_knob_has_its_default_in_the_script():
    text = SCRIPT.read_text()
    for name in GpuKnobs.model_fields:
        knob = name.upper()
        assert re.search(rf'^{knob}="(\$\(vs_\w+ )?"?\$\{{{knob}:-', text, re.M), f"{knob} has no default in the script"


def test_every_printed_override_but_the_derived_ones_is_written_in_the_script(tmp_path):
    text = SCRIPT.read_text().replace('"$multi_turn"', "actor_rollout_ref.rollout.multi_turn")
    text = text.replace('"$actor"', "actor_rollout_ref.actor").replace('"$rollout"', "actor_rollout_ref.rollout")
    for env in ({}, {"AGENT": "search_r1_agent", "DYNAMIC_BSZ": "1"}):
        done = _dry_run({"RUN_DIR": str(tmp_path / "run"), **env}, tmp_path)
        assert done.returncode == 0, done.stderr
        for override in _printed(done.stdout):
            key = override.split("=", 1)[0]
            if not key.startswith(DERIVED):
                assert f"{key}=" in text, f"{override} is not written in the script"


def test_the_users_overrides_come_last_after_what_python_adds(tmp_path):
    env = {"TRAINER": "fully_async", "RUN_DIR": str(tmp_path / "r"), "N_GPUS": "4", "ROLLOUT_GPUS": "4"}
    done = _dry_run(env, tmp_path, "trainer.total_epochs=2", "trainer.v1.trainer_mode=search_sync")
    assert done.returncode == 0, done.stderr
    printed = _printed(done.stdout)
    assert printed[-2:] == ["trainer.total_epochs=2", "trainer.v1.trainer_mode=search_sync"]
    assert "trainer.v1.trainer_mode=search_separate_async" in printed[:-2]
    assert f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path}/r/search_tool_config.yaml" in printed
    assert (tmp_path / "r" / "search_tool_config.yaml").is_file()


@pytest.mark.parametrize(
    ("env", "named"),
    [({"ROLLOUT": "tensorrt"}, "ROLLOUT=tensorrt"), ({"LR": "fast"}, "LR=fast"), ({"SHUFFLE": "yes"}, "SHUFFLE=yes")],
)
def test_a_bad_knob_is_named_before_anything_is_written(tmp_path, env, named):
    done = _dry_run({**env, "RUN_DIR": str(tmp_path / "run")}, tmp_path)
    assert done.returncode == 1 and named in done.stderr and "fix the knob named above" in done.stderr
    assert "command:" not in done.stdout and not (tmp_path / "run").exists()


def test_knobs_the_script_did_not_set_are_named():
    with pytest.raises(KnobError, match="MODEL_PATH.* not set: run the script"):
        GpuKnobs.from_env({})


def _counting_python(tmp_path: Path) -> tuple[str, Path]:
    """A PYTHON that logs each start (its arguments) and then runs this interpreter."""
    log, wrapper = tmp_path / "starts.log", tmp_path / "python"
    wrapper.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), log


def test_one_python_process_runs_before_verl(tmp_path, small_env):
    python, log = _counting_python(tmp_path)
    env = {**small_env(tmp_path / "run"), "SKIP_PREFLIGHT": "0", "WANDB_MODE": "disabled"}
    done = _dry_run(env, tmp_path, python=python)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preflight: passed" in done.stderr
    starts = log.read_text().splitlines()
    assert len(starts) == 1 and starts[0].startswith("-m verl_search.launch.prepare gpu"), starts
