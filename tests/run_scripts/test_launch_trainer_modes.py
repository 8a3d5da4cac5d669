"""TRAINER=sync|one_step_off|fully_async|colocate_async on the real training script, with DRY_RUN=1 against a real
local retriever (the preflight run in this process): each mode composes with the installed verl and passes the
preflight (a trainer-mode check included); an impossible setting stops the script in one line before any check or
launch."""

from __future__ import annotations

import shlex

import pytest

TRAIN = "run_qwen2.5-3b_instruct_search_multiturn.sh"


def command_overrides(stdout: str) -> dict[str, str]:
    """The key=value overrides of the command the dry run printed."""
    printed = stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    words = shlex.split(printed.replace("\\\n", " "))
    return dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ("sync", {"trainer.v1.trainer_mode": "search_sync"}),
        (
            "one_step_off",
            {
                "trainer.v1.trainer_mode": "search_separate_async",
                "actor_rollout_ref.hybrid_engine": "False",
                "trainer.v1.sampler.max_off_policy_threshold": "2",
                "actor_rollout_ref.rollout.n_gpus_per_node": "1",
                "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
            },
        ),
        (
            "fully_async",
            {
                "trainer.v1.trainer_mode": "search_separate_async",
                "trainer.v1.sampler.max_off_policy_threshold": "4",
                "trainer.v1.separate_async.parameter_sync_step": "1",
            },
        ),
        ("colocate_async", {"trainer.v1.trainer_mode": "search_colocate_async"}),
    ],
)
def test_each_trainer_mode_composes_and_passes_the_preflight(checked_run, small_env, tmp_path, trainer, expected):
    result = checked_run(TRAIN, TRAINER=trainer, **small_env(tmp_path / "run"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DRY_RUN=1: checks passed; not launching" in result.stdout
    assert "preflight: OK      trainer mode:" in result.stderr or "preflight: WARNING trainer mode:" in result.stderr
    got = command_overrides(result.stdout)
    assert {key: got.get(key) for key in expected} == expected


def test_the_older_trainer_mode_knob_still_selects_the_mode(checked_run, small_env, tmp_path):
    result = checked_run(TRAIN, TRAINER_MODE="colocate_async", **small_env(tmp_path / "run"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert command_overrides(result.stdout)["trainer.v1.trainer_mode"] == "search_colocate_async"


def test_an_impossible_staleness_stops_the_launch_in_one_line_before_any_check(run_script, small_env, tmp_path):
    env = {**small_env(tmp_path / "run"), "TRAINER": "fully_async", "MAX_STALENESS": "2", "WARMUP_BATCHES": "2"}
    result = run_script(TRAIN, **env)
    assert result.returncode == 1
    assert "error: MAX_STALENESS=2 is impossible with WARMUP_BATCHES=2" in result.stderr
    assert "preflight:" not in result.stderr and "command:" not in result.stdout
