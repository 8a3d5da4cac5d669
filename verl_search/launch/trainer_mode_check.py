"""Launch check of the trainer mode in the composed config (``trainer.v1.trainer_mode`` and what its async modes need),
whether it came from the ``TRAINER`` knob or from raw overrides: a wrong resource split, an impossible staleness bound,
a batch size the mode cannot divide, or a weight-sync backend that cannot load is one line before anything starts.
"""

from __future__ import annotations

from typing import Any

from verl_search.errors import KnobError
from verl_search.launch.checks import LaunchContext, PreflightError
from verl_search.launch.gpu_locks import CUPY, ROLLOUT_ENGINES
from verl_search.launch.runtime import installed_cuda
from verl_search.launch.trainer_mode import CPU_CHECKPOINT_ENGINE, VERL_MODES, check_staleness, check_sync_step

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
