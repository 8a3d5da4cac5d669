"""The preflight's checks of what a run writes and where it reports: never resuming another experiment's checkpoints
by accident, disk for the checkpoints it will keep, a wandb login before the GPUs are taken."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from verl_search.launch.checks import LaunchContext
from verl_search.launch.preflight import run_check
from verl_search.launch.run_outputs import (
    RECORD_FILE,
    RunRecord,
    check_checkpoint,
    check_checkpoint_disk,
    check_wandb,
    latest_step,
    model_parameters,
    planned_saves,
    resolve_step,
    write_record,
)
from verl_search.launch.trainer_config import compose_launch_config


class Environment:
    """Every module imports except those in ``missing``."""

    def __init__(self, missing: tuple[str, ...] = ()) -> None:
        self.missing = missing

    def python(self) -> str:
        return "3.11"

    def version(self, distribution: str) -> str | None:
        return None

    def import_error(self, module: str) -> str | None:
        return f"ModuleNotFoundError: No module named '{module}'" if module in self.missing else None

    def flash_attention_2(self) -> str | None:
        return "not here"


def context(*overrides: str, environment: Environment | None = None) -> LaunchContext:
    config = compose_launch_config(list(overrides)).config
    ctx = LaunchContext(config, dry_run=True)
    ctx.environment = environment or Environment()
    return ctx


def checkpoint(folder: Path, step: int) -> Path:
    """A verl checkpoint as verl leaves it: global_step_N/actor and the marker naming the newest step."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder / f"global_step_{step}"


def resume(folder: Path, experiment: str, *more: str):
    ctx = context(f"trainer.default_local_dir={folder}", f"trainer.experiment_name={experiment}", *more)
    return run_check("checkpoint", lambda: check_checkpoint(ctx))


def test_a_new_experiment_starts_fresh_and_resumes_only_its_own_checkpoints(tmp_path):
    folder = tmp_path / "checkpoints"
    assert resume(folder, "a").level == "ok" and "starts fresh" in resume(folder, "a").message
    write_record(folder, RunRecord("proj", "a"))
    checkpoint(folder, 100)
    assert latest_step(folder) == 100
    own = resume(folder, "a")
    assert (own.level, own.message) == ("ok", f"resumes experiment 'a' from {folder}/global_step_100")


def test_another_experiment_s_checkpoints_stop_the_launch_naming_both_runs_and_the_knob(tmp_path):
    folder = tmp_path / "checkpoints"
    write_record(folder, RunRecord("proj", "old-run"))
    checkpoint(folder, 200)
    result = resume(folder, "new-run")
    assert result.level == "error"
    assert "holds checkpoints of experiment 'old-run' (global_step_200)" in result.message
    assert "would continue those weights as experiment 'new-run'" in result.message
    assert f"RESUME_FROM={folder}/global_step_200" in result.message
    assert "trainer.resume_mode=disable" in result.message


def test_checkpoints_without_a_record_are_not_resumed_silently(tmp_path):
    checkpoint(tmp_path, 3)
    result = resume(tmp_path, "mine")
    assert result.level == "error" and "a run that left no record of its name" in result.message


def test_naming_the_checkpoint_resumes_it_on_purpose(tmp_path):
    step = checkpoint(tmp_path / "old", 7)
    assert resolve_step(tmp_path / "old") == step.resolve() and resolve_step(step) == step.resolve()
    ok = resume(tmp_path / "new", "new", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}")
    assert (ok.level, ok.message) == ("ok", f"starts from {step}")
    bad = resume(tmp_path / "new", "new", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}")
    assert bad.level == "error" and "global_step_N folder" in bad.message


@pytest.mark.parametrize(("make", "message"), [(None, "no such folder"), ("empty", "holds no verl checkpoint")])
def test_resume_from_a_folder_that_is_not_a_checkpoint_is_named(tmp_path, make, message):
    from verl_search.launch.run_outputs import CheckpointError

    path = tmp_path / "x"
    if make:
        path.mkdir()
    with pytest.raises(CheckpointError, match=message):
        resolve_step(path)


def test_a_bad_record_counts_as_none(tmp_path):
    checkpoint(tmp_path, 1)
    (tmp_path / RECORD_FILE).write_text("{not json")
    assert "left no record" in resume(tmp_path, "a").message
    write_record(tmp_path, RunRecord("p", "a"))
    assert json.loads((tmp_path / RECORD_FILE).read_text()) == {"project_name": "p", "experiment_name": "a"}
    assert resume(tmp_path, "a").level == "ok"


def model_folder(tmp_path: Path, parameters: int) -> Path:
    """A model folder holding only the config of a one-layer Qwen2 with about ``parameters`` parameters (its
    embedding carries them; counted on the meta device, nothing is allocated)."""
    from transformers import Qwen2Config

    hidden = 256
    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=max(parameters // hidden, 16),
        tie_word_embeddings=True,
    )
    folder = tmp_path / "model"
    config.save_pretrained(folder)
    return folder


def disk(tmp_path: Path, parameters: int, *more: str):
    model = model_folder(tmp_path, parameters)
    ctx = context(
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={tmp_path}/run/checkpoints",
        "trainer.save_freq=100",
        "trainer.total_training_steps=250",
        *more,
    )
    return run_check("checkpoint disk", lambda: check_checkpoint_disk(ctx))


def test_the_checkpoints_size_comes_from_the_model_and_what_verl_saves(tmp_path):
    model = model_folder(tmp_path, 3_000_000)
    count = model_parameters(str(model))
    assert count is not None and 3_000_000 <= count < 3_500_000  # the embedding, plus one small layer
    assert model_parameters(str(tmp_path / "not-here")) is None
    ctx = context("trainer.save_freq=100", "trainer.total_training_steps=250")
    assert planned_saves(ctx) == 3  # steps 100, 200 and the last, 250
    assert planned_saves(context("trainer.save_freq=100", "trainer.total_training_steps=250",
                                 "trainer.max_actor_ckpt_to_keep=1")) == 1  # fmt: skip
    ok = disk(tmp_path, 3_000_000)
    assert ok.level == "ok" and ok.message.startswith("3 checkpoint(s) of ~0.0 GiB each")
    assert "model, optimizer, extra" in ok.message


def test_a_disk_too_small_for_one_checkpoint_stops_the_launch_and_for_all_of_them_warns(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    per_parameter = 12  # fp32 weights + AdamW's two moments
    too_big = disk(tmp_path / "a", 2 * free // per_parameter)
    assert too_big.level == "error" and "less than one checkpoint" in too_big.message
    assert "trainer.max_actor_ckpt_to_keep" in too_big.message
    two_of_three = disk(tmp_path / "b", int(free / 2.5) // per_parameter)
    assert two_of_three.level == "warning" and "for 3 checkpoints" in two_of_three.message


def test_an_unknown_model_or_no_saving_is_not_checked(tmp_path):
    ctx = context("actor_rollout_ref.model.path=Org/not-downloaded", "trainer.save_freq=10")
    assert "not checked" in check_checkpoint_disk(ctx)
    assert check_checkpoint_disk(context("trainer.save_freq=-1")) == "trainer.save_freq <= 0: no checkpoints"


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """A shell with no wandb login: no key, no mode, a netrc without wandb."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login me password x\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


WANDB = 'trainer.logger=["console","wandb"]'


def wandb(*overrides: str, environment: Environment | None = None):
    ctx = context(*overrides, environment=environment)
    return run_check("wandb", lambda: check_wandb(ctx))


def test_wandb_without_a_login_stops_the_launch_and_names_the_fixes(no_wandb_login):
    result = wandb(WANDB)
    assert result.level == "error"
    assert f"no api.wandb.ai entry in {no_wandb_login}" in result.message
    for fix in ("wandb login", "WANDB_API_KEY", "WANDB_MODE=offline", "LOGGER="):
        assert fix in result.message


def test_a_wandb_login_or_a_local_mode_passes_and_the_key_is_never_shown(no_wandb_login, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-0123456789")
    keyed = wandb(WANDB)
    assert keyed.level == "ok" and "secret-key" not in keyed.line()
    monkeypatch.delenv("WANDB_API_KEY")
    no_wandb_login.write_text("machine api.wandb.ai login user password secret-key-0123456789\n")
    logged_in = wandb(WANDB)
    assert logged_in.level == "ok" and "logged in to api.wandb.ai" in logged_in.message
    assert "secret-key" not in logged_in.line()
    no_wandb_login.write_text("")
    for mode in ("offline", "disabled"):
        monkeypatch.setenv("WANDB_MODE", mode)
        assert wandb(WANDB).level == "ok"


def test_no_wandb_logger_needs_nothing_and_a_missing_wandb_is_named(no_wandb_login):
    assert wandb('trainer.logger=["console","file"]').level == "ok"
    missing = wandb(WANDB, environment=Environment(missing=("wandb",)))
    assert missing.level == "error" and "wandb, which does not import" in missing.message
