"""The trainer knob of the run scripts, ``TRAINER=sync|one_step_off|fully_async|colocate_async``, its settings, and
the verl overrides each choice means: every mode is a ``trainer.v1.trainer_mode`` of verl 0.9.1's V1 trainer under
``main_ppo`` (run_scripts/README.md tables them).

Also the preflight's check of the mode in the composed config (:func:`check_trainer_mode`), whether it came from the
``TRAINER`` knob or from raw overrides: a wrong resource split, an impossible staleness bound, a batch size the mode
cannot divide, or a weight-sync backend that cannot load is one line before anything starts.

Invariant: the settings are declared once (:class:`TrainerSettings`), a bad value is a :class:`KnobError`
naming the knob, and the overrides are derived from validated settings only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from verl_search.errors import KnobError
from verl_search.launch.checks import LaunchContext, PreflightError
from verl_search.launch.gpu_locks import CUPY, ROLLOUT_ENGINES
from verl_search.launch.runtime import installed_cuda
from verl_search.launch.script_knobs import knob_message

Trainer = Literal["sync", "one_step_off", "fully_async", "colocate_async"]
Strategy = Literal["wait", "drop"]

#: our trainer name -> verl's V1 trainer mode
VERL_MODES: dict[str, str] = {
    "sync": "sync",
    "one_step_off": "separate_async",
    "fully_async": "separate_async",
    "colocate_async": "colocate_async",
}
#: the older TRAINER_MODE knob (verl's own mode names) -> TRAINER
LEGACY_TRAINER_MODES: dict[str, str] = {
    "sync": "sync",
    "colocate_async": "colocate_async",
    "separate_async": "fully_async",
}
#: what one_step_off fixes (it is fully_async with these values)
ONE_STEP_OFF = {"max_staleness": 2, "warmup_batches": 1.0, "staleness_strategy": "wait"}
#: verl_search's CPU checkpoint engine (standalone rollout on a machine without NCCL)
CPU_CHECKPOINT_ENGINE = "zmq"
CPU_CHECKPOINT_MODULE = "verl_search.cpu.checkpoint_engine"
GPU_CHECKPOINT_ENGINE = "nccl"


class TrainerSettings(BaseModel):
    """The trainer knobs of the run scripts; each environment variable is its field name in capitals."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trainer: Trainer = Field("sync", description="TRAINER: sync, one_step_off, fully_async or colocate_async")
    search_monitor: bool = Field(
        True, description="SEARCH_MONITOR: run verl's trainer of the mode as search_<mode> (per-step search/* metrics)"
    )
    max_staleness: int | None = Field(
        None,
        ge=1,
        description="MAX_STALENESS: most policy versions a trajectory may span, from being asked for to being trained "
        "(verl's trainer.v1.sampler.max_off_policy_threshold; 'none': no bound). Default: 2 for one_step_off, "
        "4 for fully_async and colocate_async",
    )
    unbounded_staleness: bool = Field(False, description="MAX_STALENESS=none was given")
    staleness_strategy: Strategy | None = Field(
        None,
        description="STALENESS_STRATEGY: wait (the trainer waits for a trajectory about to exceed MAX_STALENESS, "
        "nothing is thrown away) or drop (verl discards it and asks again; biased against long search chains). "
        "Default: wait",
    )
    warmup_batches: float | None = Field(
        None,
        ge=0,
        description="WARMUP_BATCHES: batches of prompts asked for ahead of the trainer (fractions allowed). Default 1",
    )
    parameter_sync_step: int | None = Field(
        None,
        ge=1,
        description="PARAMETER_SYNC_STEP: optimizer updates (mini-batches) per weight sync to the rollout in "
        "one_step_off/fully_async; verl requires train_batch_size = this x ppo_mini_batch_size, so the default "
        "derives it from them",
    )
    rollout_gpus: int | None = Field(
        None, ge=1, description="ROLLOUT_GPUS: devices per node of the rollout pool (separate modes); default: as many "
        "as the trainer's",
    )  # fmt: skip
    rollout_nodes: int = Field(1, ge=1, description="ROLLOUT_NODES: nodes of the rollout pool (separate modes)")
    partial_rollout: bool = Field(
        True,
        description="PARTIAL_ROLLOUT: a weight sync pauses generation and resumes it with the new weights; always on "
        "in verl 0.9.1's V1 async trainers (0 is refused)",
    )
    checkpoint_engine: str | None = Field(
        None,
        description="CHECKPOINT_ENGINE: how weights reach a separate rollout pool (verl's nccl, nixl, ...; zmq: "
        "verl_search's, for CPUs). Default: zmq on a CPU, nccl on GPUs",
    )

    @property
    def verl_mode(self) -> str:
        return VERL_MODES[self.trainer]

    @property
    def trainer_mode(self) -> str:
        """``trainer.v1.trainer_mode``: verl's mode, or its ``search_`` twin that adds the per-step search metrics."""
        return f"search_{self.verl_mode}" if self.search_monitor else self.verl_mode

    @property
    def separate(self) -> bool:
        return self.verl_mode == "separate_async"

    @property
    def asynchronous(self) -> bool:
        return self.trainer != "sync"

    @model_validator(mode="after")
    def _consistent(self) -> TrainerSettings:
        given = self.model_fields_set
        if self.trainer == "sync":
            extra = sorted(
                f.upper()
                for f in ("max_staleness", "staleness_strategy", "warmup_batches", "parameter_sync_step")
                + ("rollout_gpus", "checkpoint_engine")
                if f in given and getattr(self, f) is not None
            )
            if extra or self.unbounded_staleness:
                raise ValueError(f"{', '.join(extra or ['MAX_STALENESS'])} apply only to TRAINER=one_step_off, "
                                 "fully_async or colocate_async (TRAINER=sync is on-policy)")  # fmt: skip
        if self.trainer == "one_step_off":
            for field, value in ONE_STEP_OFF.items():
                if field in given and getattr(self, field) not in (None, value):
                    raise ValueError(
                        f"TRAINER=one_step_off fixes {field.upper()}={value:g}" if isinstance(value, float)
                        else f"TRAINER=one_step_off fixes {field.upper()}={value}"
                    ) from None  # fmt: skip
            if self.unbounded_staleness:
                raise ValueError("TRAINER=one_step_off fixes MAX_STALENESS=2; use TRAINER=fully_async for no bound")
        if not self.partial_rollout:
            raise ValueError(
                "PARTIAL_ROLLOUT=0: verl 0.9.1's V1 async trainers always resume a paused generation with the new "
                "weights (FullyAsyncLLMServerClient); bound its off-policy share with MAX_STALENESS instead"
            )
        if not self.separate:
            for field in ("rollout_gpus", "parameter_sync_step", "checkpoint_engine"):
                if field in given and getattr(self, field) is not None:
                    raise ValueError(f"{field.upper()} applies only to TRAINER=one_step_off or fully_async")
        return self

    # ---- resolved values ---------------------------------------------------------------------------------------
    def staleness(self) -> int | None:
        if self.trainer == "one_step_off":
            return ONE_STEP_OFF["max_staleness"]
        if self.unbounded_staleness:
            return None
        return self.max_staleness if self.max_staleness is not None else 4

    def strategy(self) -> str:
        return self.staleness_strategy or "wait"

    def warmup(self) -> float:
        if self.trainer == "one_step_off":
            return ONE_STEP_OFF["warmup_batches"]
        return 1.0 if self.warmup_batches is None else self.warmup_batches

    def sync_step(self, train_batch_size: int, mini_batch_size: int) -> int:
        if self.parameter_sync_step is not None:
            return self.parameter_sync_step
        return max(1, train_batch_size // max(1, mini_batch_size))

    def engine(self, device: str) -> str:
        if self.checkpoint_engine:
            return self.checkpoint_engine
        return CPU_CHECKPOINT_ENGINE if device == "cpu" else GPU_CHECKPOINT_ENGINE


def minimum_staleness(warmup_batches: float) -> int:
    """The fewest versions a queued trajectory spans when trained: with W batches asked for ahead, a prompt asked for
    at step s is trained at step s + ceil(W) at the earliest (verl trains the oldest first)."""
    return math.ceil(warmup_batches) + 1


def check_staleness(staleness: int | None, warmup_batches: float, trainer: str) -> None:
    """Raise when the staleness bound cannot hold what the warm-up queues (every queued trajectory would be dropped,
    or waited for so the trainer never runs ahead)."""
    if staleness is None:
        return
    if staleness < 2:
        raise KnobError(f"MAX_STALENESS={staleness} allows no trajectory from an older policy: that is TRAINER=sync")
    need = minimum_staleness(warmup_batches)
    if staleness < need:
        raise KnobError(
            f"MAX_STALENESS={staleness} is impossible with WARMUP_BATCHES={warmup_batches:g}: queued trajectories are "
            f"trained {need} versions after they were asked for; set MAX_STALENESS>={need} or fewer warm-up batches"
            f" (TRAINER={trainer})"
        )


def settings_from_env(env: Mapping[str, str]) -> TrainerSettings:
    """The settings the environment asks for (unset or empty variables keep their defaults); TRAINER_MODE, the older
    knob, is read when TRAINER is unset."""
    knobs = [field for field in TrainerSettings.model_fields if field != "unbounded_staleness"]
    raw: dict[str, object] = {field: env[field.upper()] for field in knobs if env.get(field.upper(), "") != ""}
    legacy = env.get("TRAINER_MODE", "")
    if legacy:
        if legacy not in LEGACY_TRAINER_MODES:
            raise KnobError(
                f"TRAINER_MODE={legacy}: choose sync, colocate_async or separate_async (or use TRAINER=one_step_off|"
                "fully_async|sync|colocate_async)"
            )
        mapped = LEGACY_TRAINER_MODES[legacy]
        if "trainer" in raw and raw["trainer"] != mapped:
            raise KnobError(f"TRAINER={raw['trainer']} and TRAINER_MODE={legacy} disagree; set only TRAINER")
        raw.setdefault("trainer", mapped)
    for field in ("search_monitor", "partial_rollout"):
        if field in raw and raw[field] not in ("0", "1"):
            raise KnobError(f"{field.upper()}={raw[field]}: 1 or 0")
    if str(raw.get("max_staleness", "")).lower() in ("none", "null", "inf"):
        raw.pop("max_staleness")
        raw["unbounded_staleness"] = True
    try:
        return TrainerSettings(**raw)
    except ValidationError as e:
        raise KnobError(knob_message(e, raw, TrainerSettings)) from e


def check_sync_step(train_batch_size: int, mini_batch_size: int, sync_step: int) -> None:
    """verl's separate_async syncs the weights every ``sync_step`` updates, so one batch must be exactly that many
    mini-batches."""
    if train_batch_size != sync_step * mini_batch_size:
        raise KnobError(
            f"PARAMETER_SYNC_STEP={sync_step}: verl's separate_async needs TRAIN_BATCH_SIZE={train_batch_size} = "
            f"PARAMETER_SYNC_STEP x PPO_MINI_BATCH_SIZE={mini_batch_size}"
        )


def trainer_overrides(
    settings: TrainerSettings, *, devices: int, train_batch_size: int, mini_batch_size: int, device: str
) -> list[str]:
    """verl overrides for ``settings``; ``devices`` is the trainer's devices per node (the default rollout pool size),
    the batch sizes are the run's ``data.train_batch_size`` and ``actor.ppo_mini_batch_size``."""
    mode = settings.verl_mode
    out = [f"trainer.v1.trainer_mode={settings.trainer_mode}"]
    if not settings.asynchronous:
        return out
    staleness, warmup = settings.staleness(), settings.warmup()
    check_staleness(staleness, warmup, settings.trainer)
    out += [
        f"trainer.v1.sampler.max_off_policy_threshold={'null' if staleness is None else staleness}",
        f"trainer.v1.sampler.max_off_policy_strategy={settings.strategy()}",
        f"trainer.v1.{mode}.num_warmup_batches={warmup:g}",
    ]
    if not settings.separate:
        return out
    sync_step = settings.sync_step(train_batch_size, mini_batch_size)
    check_sync_step(train_batch_size, mini_batch_size, sync_step)
    engine = settings.engine(device)
    out += [
        "actor_rollout_ref.hybrid_engine=False",
        f"trainer.v1.separate_async.parameter_sync_step={sync_step}",
        f"actor_rollout_ref.rollout.nnodes={settings.rollout_nodes}",
        f"actor_rollout_ref.rollout.n_gpus_per_node={settings.rollout_gpus or devices}",
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={engine}",
    ]
    if engine == CPU_CHECKPOINT_ENGINE:
        out.append(f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={CPU_CHECKPOINT_MODULE}")
    return out


def trainer_note(settings: TrainerSettings) -> str:
    """The trainer mode a run uses, as the scripts print it."""
    chosen = os.environ.get("TRAINER")
    return f"trainer: {settings.trainer_mode}" + (f" (TRAINER={chosen})" if chosen else "")


#: what verl's checkpoint engines import (a missing library leaves the backend unregistered)
ENGINE_LIBRARIES = {"nccl": "cupy", "nixl": "nixl", "mooncake": "mooncake", "hccl": "torch_npu"}


def verl_mode(name: str) -> str:
    """verl's mode for a ``trainer.v1.trainer_mode`` value (``search_fully`` twins map to their base)."""
    from verl_search.monitor.trainer import SEARCH_MODES

    mode = SEARCH_MODES.get(name, name)
    modes = list(dict.fromkeys(VERL_MODES.values()))  # verl's V1 modes; our search_* twins run the same trainers
    if mode not in modes:
        known = ", ".join([*modes, *SEARCH_MODES])
        raise PreflightError(f"trainer.v1.trainer_mode={name} is not a V1 trainer mode ({known})")
    return mode


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def check_trainer_mode(ctx: LaunchContext) -> str:
    """The mode exists; an async mode's staleness bound can hold its warm-up; a separate mode has a rollout pool that
    makes whole replicas, a batch its sync step divides, a loadable weight-sync backend and the devices for both."""
    config = ctx.config
    v1 = config.trainer.v1
    mode = verl_mode(str(v1.trainer_mode))
    if mode == "sync":
        return f"{v1.trainer_mode} (on-policy)"
    sampler = v1.sampler
    staleness = sampler.max_off_policy_threshold
    warmup = float(v1[mode].num_warmup_batches)
    try:
        check_staleness(None if staleness is None else int(staleness), warmup, mode)
    except KnobError as e:
        raise PreflightError(f"trainer.v1.sampler.max_off_policy_threshold: {e}") from e
    bound = (
        "no staleness bound" if staleness is None else f"staleness <= {staleness} ({sampler.max_off_policy_strategy})"
    )
    note = f"{v1.trainer_mode}: {bound}, {warmup:g} warm-up batch(es), partial rollout"
    if mode == "colocate_async":
        return note
    return f"{note}; {_check_separate(ctx)}"


def _check_separate(ctx: LaunchContext) -> str:
    config, rollout = ctx.config, ctx.rollout
    trainer = config.trainer
    rollout_nodes, rollout_gpus = _int(rollout.nnodes), _int(rollout.n_gpus_per_node)
    if rollout_nodes < 1 or rollout_gpus < 1:
        raise PreflightError(
            f"separate_async needs its own rollout pool: actor_rollout_ref.rollout.nnodes={rollout_nodes} and "
            f"n_gpus_per_node={rollout_gpus} must be >= 1 (ROLLOUT_GPUS, ROLLOUT_NODES)"
        )
    replica = _int(rollout.tensor_model_parallel_size) * _int(rollout.data_parallel_size)
    replica *= _int(rollout.pipeline_model_parallel_size)
    pool = rollout_nodes * rollout_gpus
    if replica < 1 or pool % replica:
        raise PreflightError(
            f"the rollout pool's {pool} device(s) (ROLLOUT_GPUS x ROLLOUT_NODES) do not split into replicas of "
            f"{replica} (tensor x data x pipeline parallel size)"
        )
    batch, mini = int(config.data.train_batch_size), int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    sync_step = int(trainer.v1.separate_async.parameter_sync_step)
    try:
        check_sync_step(batch, mini, sync_step)
    except KnobError as e:
        raise PreflightError(f"trainer.v1.separate_async.parameter_sync_step: {e} (unset, it is derived)") from e
    engine = rollout.checkpoint_engine
    backend = str(engine.backend)
    if backend == "naive":
        raise PreflightError(
            "actor_rollout_ref.rollout.checkpoint_engine.backend=naive cannot reach a separate rollout pool: use "
            f"nccl on GPUs or {CPU_CHECKPOINT_ENGINE} on a CPU (CHECKPOINT_ENGINE)"
        )
    if engine.get("custom_backend_module"):
        problem = ctx.environment.import_error(str(engine.custom_backend_module))
        if problem:
            raise PreflightError(f"checkpoint_engine.custom_backend_module={engine.custom_backend_module}: {problem}")
    elif backend == CPU_CHECKPOINT_ENGINE:
        raise PreflightError(
            f"checkpoint_engine.backend={CPU_CHECKPOINT_ENGINE} needs checkpoint_engine.custom_backend_module="
            "verl_search.cpu.checkpoint_engine (the run scripts set it)"
        )
    elif backend in ENGINE_LIBRARIES and (problem := ctx.environment.import_error(ENGINE_LIBRARIES[backend])):
        fix = f" ({_cupy_fix(ctx)})" if backend == "nccl" else ""
        raise ctx.problem(f"checkpoint_engine.backend={backend} needs {ENGINE_LIBRARIES[backend]}{fix}: {problem}")
    trainer_devices = _int(trainer.n_gpus_per_node)
    split = f"trainer {trainer_devices} + rollout {rollout_gpus} device(s) per node, weights over {backend}"
    _check_devices(ctx, trainer_devices, rollout_gpus)
    return f"{split}, sync every {sync_step} update(s)"


def _cupy_fix(ctx: LaunchContext) -> str:
    """How to get the cupy build that matches the installed torch's CUDA major (every GPU lock carries it)."""
    cuda = installed_cuda(ctx.environment)
    if cuda is None:
        builds = ", ".join(f"{CUPY[major]} for a CUDA {major} torch" for major in sorted(CUPY))
        return f"{builds}; every GPU lock has it"
    rollout = ctx.rollout.name if ctx.rollout.name in ROLLOUT_ENGINES else "|".join(ROLLOUT_ENGINES)
    return f"pip install {CUPY[cuda]} for this CUDA {cuda} torch, or make install-gpu ROLLOUT={rollout} CUDA={cuda}"


def _check_devices(ctx: LaunchContext, trainer_devices: int, rollout_devices: int) -> None:
    """Enough devices for both pools: Ray's logical GPUs on a CPU, visible CUDA GPUs otherwise (one node)."""
    need = trainer_devices + rollout_devices
    if str(ctx.config.trainer.device) == "cpu":
        ray_init = ctx.config.get("ray_kwargs", {}).get("ray_init", {})
        logical = _int(ray_init.get("num_gpus"))
        if logical < need:
            raise PreflightError(
                f"+ray_kwargs.ray_init.num_gpus={logical} logical GPUs cannot place trainer {trainer_devices} + "
                f"rollout {rollout_devices} (set it to {need}; run_tiny_search_cpu.sh does)"
            )
        return
    import torch

    visible = torch.cuda.device_count()
    if visible < need:
        raise ctx.problem(
            f"trainer {trainer_devices} + rollout {rollout_devices} GPUs per node = {need}, this node sees {visible}: "
            f"split them, e.g. N_GPUS={max(1, visible - visible // 2)} ROLLOUT_GPUS={max(1, visible // 2)}"
        )
