"""The verl overrides a trainer mode means (:class:`~verl_search.launch.trainer_mode.TrainerSettings`, the
``TRAINER`` knob and its settings), and the CLI the run scripts call for them:

``python -m verl_search.launch.trainer_overrides --from-env --devices N --train-batch-size B --mini-batch-size M
--device cpu|cuda`` prints one override per line.

Invariant: the overrides are derived from validated settings only; a combination verl cannot run (a staleness bound
the warm-up breaks, a batch size the sync step does not divide) is a ``TrainerModeError`` naming the knob.
"""

from __future__ import annotations

import argparse
import os
import sys

from verl_search.launch.trainer_mode import (
    CPU_CHECKPOINT_ENGINE,
    CPU_CHECKPOINT_MODULE,
    TrainerModeError,
    TrainerSettings,
    check_staleness,
    settings_from_env,
)


def trainer_overrides(
    settings: TrainerSettings, *, devices: int, train_batch_size: int, mini_batch_size: int, device: str
) -> list[str]:
    """verl overrides for ``settings``; ``devices`` is the trainer's devices per node (the default rollout pool size),
    the batch sizes are the run's ``data.train_batch_size`` and ``actor.ppo_mini_batch_size``."""
    mode = settings.verl_mode
    name = f"search_{mode}" if settings.search_monitor else mode
    out = [f"trainer.v1.trainer_mode={name}"]
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
    if train_batch_size != sync_step * mini_batch_size:
        raise TrainerModeError(
            f"PARAMETER_SYNC_STEP={sync_step}: verl's separate_async needs TRAIN_BATCH_SIZE={train_batch_size} = "
            f"PARAMETER_SYNC_STEP x PPO_MINI_BATCH_SIZE={mini_batch_size}"
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_search.launch.trainer_overrides",
        description="Print the verl overrides of the TRAINER knob and its settings, one per line.",
    )
    parser.add_argument("--from-env", action="store_true", help="read TRAINER and its knobs from the environment")
    parser.add_argument("--devices", type=int, required=True, help="the trainer's devices per node")
    parser.add_argument("--train-batch-size", type=int, required=True)
    parser.add_argument("--mini-batch-size", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    args = parser.parse_args(argv)
    try:
        settings = settings_from_env(os.environ if args.from_env else {})
        lines = trainer_overrides(
            settings,
            devices=args.devices,
            train_batch_size=args.train_batch_size,
            mini_batch_size=args.mini_batch_size,
            device=args.device,
        )
    except TrainerModeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
