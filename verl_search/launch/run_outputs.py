"""What a run writes and where it reports, as a launch sees it: verl checkpoint folders (the latest step, the
checkpoint a ``RESUME_FROM`` names, the run record a launch leaves beside them naming the experiment that writes
there), and the launch checks of the checkpoint a run resumes (never another experiment's by accident), the disk its
checkpoints need and the wandb login its logger needs.

Invariant: only :func:`write_record` writes (atomically, on a real launch); verl's own files are read as verl writes
them and never changed; a secret (a wandb key) is only ever tested for presence, never shown.
"""

from __future__ import annotations

import json
import netrc
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from verl_search.atomic import atomic_path
from verl_search.errors import VerlSearchError
from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning, as_list, read_data_file

#: verl's marker of the newest complete checkpoint in a ``trainer.default_local_dir``
LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"
#: what a launch leaves in its checkpoint folder: the project and experiment that write there
RECORD_FILE = "verl_search_run.json"


class CheckpointError(VerlSearchError, ValueError):
    """A folder named as a checkpoint is not one; the message names the folder and what is missing."""

    kind = "checkpoint"


@dataclass(frozen=True)
class RunRecord:
    """The run a checkpoint folder belongs to."""

    project_name: str
    experiment_name: str


def latest_step(folder: Path) -> int | None:
    """The newest checkpointed step in ``folder`` (verl's marker file, else the highest ``global_step_N``), or None."""
    folder = Path(folder)
    marker = folder / LATEST_FILE
    if marker.is_file():
        text = marker.read_text(encoding="utf-8").strip()
        if text.isdigit():
            return int(text)
    steps = [
        int(p.name.removeprefix(STEP_PREFIX))
        for p in (folder.glob(f"{STEP_PREFIX}*") if folder.is_dir() else [])
        if p.is_dir() and p.name.removeprefix(STEP_PREFIX).isdigit()
    ]
    return max(steps) if steps else None


def resolve_step(path: str | Path) -> Path:
    """The absolute ``global_step_N`` folder that ``path`` names: itself, or a checkpoint folder's latest step."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{path}: no such folder")
    if not folder.name.startswith(STEP_PREFIX):
        step = latest_step(folder)
        if step is None:
            raise CheckpointError(f"{path}: holds no verl checkpoint ({LATEST_FILE} or {STEP_PREFIX}N/)")
        folder = folder / f"{STEP_PREFIX}{step}"
    if not (folder / "actor").is_dir():
        raise CheckpointError(f"{folder}: no actor/ folder (not a verl checkpoint)")
    return folder.resolve()


def read_record(folder: Path) -> RunRecord | None:
    """The run record in ``folder``, or None when there is none (or it cannot be read as one)."""
    try:
        raw = json.loads((Path(folder) / RECORD_FILE).read_text(encoding="utf-8"))
        return RunRecord(project_name=str(raw["project_name"]), experiment_name=str(raw["experiment_name"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(folder: Path, record: RunRecord) -> Path:
    """Mark ``folder`` (created if needed) as ``record``'s checkpoint folder; returns the record's path."""
    path = Path(folder) / RECORD_FILE
    text = json.dumps({"project_name": record.project_name, "experiment_name": record.experiment_name}, indent=1)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")
    return path


#: bytes a verl FSDP checkpoint holds per model parameter, by ``checkpoint.save_contents`` entry: the fp32 sharded
#: weights, AdamW's two fp32 moments, and a full Hugging Face copy
CHECKPOINT_BYTES_PER_PARAMETER = {"model": 4, "optimizer": 8, "hf_model": 4}
#: wandb modes that need no login
WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")
GIB = 1024**3


def check_checkpoint(ctx: LaunchContext) -> str:
    """``resume_mode=resume_path``: the checkpoint exists and holds the actor. ``auto``: the checkpoint folder holds
    nothing, or this experiment's own checkpoints (verl would otherwise continue another run's weights silently)."""
    trainer = ctx.config.trainer
    if trainer.resume_mode == "resume_path":
        path = str(trainer.resume_from_path)
        if STEP_PREFIX not in path:
            raise PreflightError(f"trainer.resume_from_path={path}: must be a .../{STEP_PREFIX}N folder")
        if not (Path(path) / "actor").is_dir():
            raise PreflightError(f"trainer.resume_from_path={path}: no actor/ folder (not a verl checkpoint)")
        return f"starts from {path}"
    if trainer.resume_mode != "auto":
        return f"resume_mode={trainer.resume_mode}"
    folder = Path(str(trainer.default_local_dir))
    step = latest_step(folder)
    experiment = str(trainer.experiment_name)
    if step is None:
        return f"{folder}: no checkpoint yet, experiment '{experiment}' starts fresh"
    record = read_record(folder)
    if record is not None and record.experiment_name == experiment:
        return f"resumes experiment '{experiment}' from {folder}/{STEP_PREFIX}{step}"
    owner = (
        f"experiment '{record.experiment_name}'"
        if record is not None
        else "a run that left no record of its name (plain verl, or an older verl-search)"
    )
    raise PreflightError(
        f"trainer.default_local_dir={folder} already holds checkpoints of {owner} ({STEP_PREFIX}{step}), and "
        f"trainer.resume_mode=auto would continue those weights as experiment '{experiment}'. To resume that run, "
        f"launch it under its own name (trainer.experiment_name=...); to start from its weights on purpose, set "
        f"RESUME_FROM={folder}/{STEP_PREFIX}{step}; to start fresh, give this experiment a folder of its own (leave "
        "RUN_DIR and trainer.default_local_dir unset) or set trainer.resume_mode=disable"
    )


def model_parameters(path: str, trust_remote_code: bool = False) -> int | None:
    """The parameter count of the model at ``path`` (a folder, or a hub id in the local cache) from its config alone,
    built on the meta device; None when its config is not on this machine."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception:  # a hub id not downloaded yet, or no config.json: nothing to count here
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())


def planned_saves(ctx: LaunchContext) -> int | None:
    """How many checkpoints the run keeps on disk at most (verl saves every ``save_freq`` steps and at the last one,
    and keeps ``max_actor_ckpt_to_keep`` of them); None when the training set cannot be read."""
    trainer, data = ctx.config.trainer, ctx.config.data
    steps = trainer.get("total_training_steps")
    if steps is None:
        try:
            rows = sum(read_data_file(path).rows for path in as_list(data.train_files))
        except PreflightError:
            return None  # reported by the data check
        steps = rows // int(data.train_batch_size) * int(trainer.total_epochs)
    freq = int(trainer.save_freq)
    saves = int(steps) // freq + (1 if int(steps) % freq else 0)
    keep = trainer.get("max_actor_ckpt_to_keep")
    return min(saves, int(keep)) if keep else saves


def check_checkpoint_disk(ctx: LaunchContext) -> str:
    """The checkpoint folder's disk has room for the first checkpoint (an error) and for all it will keep (a
    warning), from the model's size and ``checkpoint.save_contents``."""
    trainer = ctx.config.trainer
    if int(trainer.save_freq) <= 0:
        return "trainer.save_freq <= 0: no checkpoints"
    model = ctx.config.actor_rollout_ref.model
    parameters = model_parameters(str(model.path), bool(model.get("trust_remote_code", False)))
    if parameters is None:
        return f"{model.path} is not on this machine yet: its checkpoint size is not known (not checked)"
    contents = as_list(ctx.config.actor_rollout_ref.actor.checkpoint.save_contents)
    per_checkpoint = parameters * sum(CHECKPOINT_BYTES_PER_PARAMETER.get(c, 0) for c in contents)
    folder = Path(str(trainer.default_local_dir)).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    kept = planned_saves(ctx) or 1
    sizes = f"~{per_checkpoint / GIB:.1f} GiB each ({parameters / 1e9:.2f}B parameters: {', '.join(contents)})"
    fix = "free space, point trainer.default_local_dir elsewhere, or set trainer.max_actor_ckpt_to_keep"
    if free < per_checkpoint:
        raise PreflightError(
            f"{existing} has {free / GIB:.1f} GiB free, less than one checkpoint, {sizes}: the run would fail at "
            f"its first save (step {trainer.save_freq}); {fix}"
        )
    if free < kept * per_checkpoint:
        raise PreflightWarning(
            f"{existing} has {free / GIB:.1f} GiB free for {kept} checkpoints of {sizes}: the disk fills before the "
            f"last save; {fix}"
        )
    return f"{kept} checkpoint(s) of {sizes} fit in the {free / GIB:.0f} GiB free at {existing}"


def check_wandb(ctx: LaunchContext) -> str:
    """With wandb among ``trainer.logger``: wandb imports and this shell is logged in (``WANDB_API_KEY`` or the
    netrc entry ``wandb login`` writes), unless ``WANDB_MODE`` needs no login."""
    loggers = as_list(ctx.config.trainer.logger)
    if "wandb" not in loggers:
        return f"not used (trainer.logger={loggers})"
    other = 'LOGGER=\'["console","file"]\' to log without it'
    error = ctx.environment.import_error("wandb")
    if error is not None:
        raise PreflightError(
            f"trainer.logger has wandb, which does not import ({error}): pip install wandb, or {other}"
        )
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in WANDB_LOCAL_MODES:
        return f"WANDB_MODE={mode}: no login needed" + (
            " (wandb sync uploads the run later)" if mode != "disabled" else ""
        )
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY is set"
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        if netrc.netrc(str(path)).authenticators(host):
            return f"logged in to {host} ({path})"
    except (OSError, netrc.NetrcParseError):
        pass  # no netrc, or one that cannot be read: no login
    raise PreflightError(
        f"trainer.logger has wandb but this shell is not logged in (no WANDB_API_KEY, no {host} entry in {path}): "
        "the run would stop when verl starts wandb, after Ray and its workers are up; run `wandb login` or "
        "export WANDB_API_KEY, or set "
        f"WANDB_MODE=offline (upload later with wandb sync), or {other}"
    )


def resume_overrides(resume_from: str) -> list[str]:
    """``RESUME_FROM`` as verl overrides (resume from that step; nothing when it is empty)."""
    if not resume_from:
        return []
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}"]
