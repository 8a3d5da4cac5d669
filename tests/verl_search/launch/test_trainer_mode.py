"""The TRAINER knob: what each mode composes for verl, and every impossible setting refused in one line before a run,
both from the knobs (``verl_search.launch.trainer_mode``) and from the composed config (the preflight's check)."""

from __future__ import annotations

import pytest

from verl_search.errors import KnobError
from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning
from verl_search.launch.trainer_config import compose_launch_config
from verl_search.launch.trainer_mode import check_trainer_mode, settings_from_env, trainer_overrides


def overrides(env: dict[str, str], *, batch: int = 4, mini: int = 4, device: str = "cpu") -> dict[str, str]:
    lines = trainer_overrides(
        settings_from_env(env), devices=1, train_batch_size=batch, mini_batch_size=mini, device=device
    )
    return dict(line.split("=", 1) for line in lines)


def test_sync_is_the_default_and_runs_verls_sync_trainer_with_search_metrics():
    assert overrides({}) == {"trainer.v1.trainer_mode": "search_sync"}
    assert overrides({"SEARCH_MONITOR": "0"}) == {"trainer.v1.trainer_mode": "sync"}


def test_one_step_off_is_a_separate_rollout_one_batch_ahead_with_staleness_one_update():
    got = overrides({"TRAINER": "one_step_off"})
    assert got["trainer.v1.trainer_mode"] == "search_separate_async"
    assert got["actor_rollout_ref.hybrid_engine"] == "False"  # the rollout has its own pool, none on the trainer's
    assert got["trainer.v1.separate_async.num_warmup_batches"] == "1"
    assert got["trainer.v1.sampler.max_off_policy_threshold"] == "2"  # asked for at step s, trained by step s+1
    assert got["trainer.v1.sampler.max_off_policy_strategy"] == "wait"  # stragglers are waited for, never dropped
    assert got["actor_rollout_ref.rollout.n_gpus_per_node"] == "1"
    assert got["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "zmq"  # on a CPU
    assert (
        overrides({"TRAINER": "one_step_off"}, device="cuda")["actor_rollout_ref.rollout.checkpoint_engine.backend"]
        == "nccl"
    )


def test_fully_async_knobs_reach_verl():
    env = {"TRAINER": "fully_async", "MAX_STALENESS": "6", "STALENESS_STRATEGY": "drop", "WARMUP_BATCHES": "1.5"}
    got = overrides({**env, "ROLLOUT_GPUS": "3"}, batch=8, mini=2)
    assert got["trainer.v1.sampler.max_off_policy_threshold"] == "6"
    assert got["trainer.v1.sampler.max_off_policy_strategy"] == "drop"
    assert got["trainer.v1.separate_async.num_warmup_batches"] == "1.5"
    assert got["trainer.v1.separate_async.parameter_sync_step"] == "4"  # derived: 8 prompts / mini-batches of 2
    assert got["actor_rollout_ref.rollout.n_gpus_per_node"] == "3"
    assert (
        overrides({"TRAINER": "fully_async", "MAX_STALENESS": "none"})["trainer.v1.sampler.max_off_policy_threshold"]
        == "null"
    )


def test_the_older_trainer_mode_knob_still_works():
    assert overrides({"TRAINER_MODE": "separate_async"}) == overrides({"TRAINER": "fully_async"})
    assert overrides({"TRAINER_MODE": "colocate_async"})["trainer.v1.trainer_mode"] == "search_colocate_async"


OFF, FULL = {"TRAINER": "one_step_off"}, {"TRAINER": "fully_async"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINER": "fast"}, "TRAINER=fast: choose sync, one_step_off, fully_async or colocate_async"),
        ({"TRAINER": "sync", "MAX_STALENESS": "3"}, "MAX_STALENESS apply only to TRAINER=one_step_off"),
        ({**OFF, "MAX_STALENESS": "3"}, "TRAINER=one_step_off fixes MAX_STALENESS=2"),
        ({**FULL, "MAX_STALENESS": "1"}, "MAX_STALENESS=1 allows no trajectory from an older policy"),
        ({**FULL, "MAX_STALENESS": "2", "WARMUP_BATCHES": "2"}, "MAX_STALENESS=2 is impossible with WARMUP_BATCHES=2"),
        ({**FULL, "MAX_STALENESS": "0"}, "MAX_STALENESS=0: Input should be greater than or equal to 1"),
        ({**FULL, "PARTIAL_ROLLOUT": "0"}, "PARTIAL_ROLLOUT=0: verl 0.9.1's V1 async trainers always resume"),
        ({**FULL, "ROLLOUT_GPUS": "0"}, "ROLLOUT_GPUS=0: Input should be greater than or equal to 1"),
        ({"TRAINER": "colocate_async", "ROLLOUT_GPUS": "2"}, "ROLLOUT_GPUS applies only to TRAINER=one_step_off or"),
        ({**FULL, "TRAINER_MODE": "sync"}, "TRAINER=fully_async and TRAINER_MODE=sync disagree"),
        ({"SEARCH_MONITOR": "yes"}, "SEARCH_MONITOR=yes: 1 or 0"),
    ],
)
def test_bad_knobs_are_one_line_errors_naming_the_knob(env, message):
    with pytest.raises(KnobError) as caught:
        overrides(env)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_sync_step_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(match=r"TRAIN_BATCH_SIZE=8 = PARAMETER_SYNC_STEP x PPO_MINI_BATCH_SIZE=2"):
        overrides({"TRAINER": "fully_async", "PARAMETER_SYNC_STEP": "3"}, batch=8, mini=2)


# ---- the preflight check of the composed config --------------------------------------------------------------------

BASE = [
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "+ray_kwargs.ray_init.num_gpus=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
]


def check(*extra: str, env: dict[str, str] | None = None, dry_run: bool = False) -> str:
    knobs = trainer_overrides(
        settings_from_env(env or {"TRAINER": "fully_async"}),
        devices=1,
        train_batch_size=4,
        mini_batch_size=4,
        device="cpu",
    )
    composed = compose_launch_config([*BASE, *knobs, *extra])
    assert not composed.unknown_keys
    return check_trainer_mode(LaunchContext(composed.config, dry_run=dry_run))


def test_each_mode_passes_the_preflight_as_composed():
    assert check(env={"TRAINER": "sync"}) == "search_sync (on-policy)"
    assert "staleness <= 2 (wait)" in check(env={"TRAINER": "one_step_off"})
    note = check(env={"TRAINER": "fully_async"})
    assert "trainer 1 + rollout 1 device(s) per node, weights over zmq, sync every 1 update(s)" in note
    assert "staleness <= 4 (wait)" in check(env={"TRAINER": "colocate_async"})


ROLLOUT = "actor_rollout_ref.rollout"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["trainer.v1.trainer_mode=separate"], "trainer.v1.trainer_mode=separate is not a V1 trainer mode"),
        (["trainer.v1.sampler.max_off_policy_threshold=1"], "allows no trajectory from an older policy"),
        (["trainer.v1.separate_async.num_warmup_batches=4"], "MAX_STALENESS=4 is impossible with WARMUP_BATCHES=4"),
        ([f"{ROLLOUT}.n_gpus_per_node=0"], "separate_async needs its own rollout pool"),
        (
            [
                f"{ROLLOUT}.n_gpus_per_node=3",
                f"{ROLLOUT}.tensor_model_parallel_size=2",
                "ray_kwargs.ray_init.num_gpus=4",
            ],
            "the rollout pool's 3 device(s)",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=2"],
            "parameter_sync_step: PARAMETER_SYNC_STEP=1: verl's separate_async needs TRAIN_BATCH_SIZE=4 = "
            "PARAMETER_SYNC_STEP x PPO_MINI_BATCH_SIZE=2",
        ),
        ([f"{ROLLOUT}.checkpoint_engine.backend=naive"], "backend=naive cannot reach a separate rollout"),
        ([f"{ROLLOUT}.checkpoint_engine.custom_backend_module=no.such.module"], "no.such.module: ModuleNotFoundError"),
        (["ray_kwargs.ray_init.num_gpus=1"], "num_gpus=1 logical GPUs cannot place trainer 1 + rollout 1"),
    ],
)
def test_impossible_async_configs_are_one_line_preflight_errors(extra, message):
    with pytest.raises(PreflightError) as caught:
        check(*extra)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not isinstance(caught.value, PreflightWarning)


def test_on_gpus_the_split_must_fit_the_node():
    with pytest.raises(PreflightWarning, match=r"trainer 1 \+ rollout 1 GPUs per node = 2, this node sees 0"):
        check("trainer.device=cuda", dry_run=True)
