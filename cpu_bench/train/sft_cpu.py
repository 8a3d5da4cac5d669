"""``python -m cpu_bench.train.sft_cpu [hydra overrides]``: verl's own SFT trainer (``verl.trainer.sft_trainer``,
config ``sft_trainer_engine``) on the CPU backend, world size 1, without torchrun.

verl 0.9.1's ``sft_trainer.run_sft`` calls ``verl.utils.distributed.initialize_global_process_group`` (torchrun-style,
with no backend parameter), which builds the backend ``cpu:gloo,cpu:gloo`` on the CPU platform: torch refuses the
duplicate. The bridge here is the same call with ``cpu:gloo``, bound in ``verl.utils.distributed`` before the trainer
runs (it imports the name when it runs, not at import), and checked against verl's version like the plugin's bridges
(:mod:`verl_search.cpu.verl_gaps`). The launcher also sets the single-process rendezvous variables torchrun would set,
and selects the CPU platform.
Invariant: nothing is changed unless the platform is ``cpu``; verl's files are never edited.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import timedelta
from typing import Any

from cpu_bench.background_server import free_port
from verl_search.cpu.verl_gaps import CPU_BACKEND, check_verl_version

# What torchrun --nproc_per_node=1 would export; a free port is picked unless MASTER_PORT is set.
_RENDEZVOUS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def prepare_environment(env: dict[str, str] | Any = os.environ) -> None:
    """Select the CPU platform and the FSDP engines and set single-process rendezvous defaults."""
    env.setdefault("VERL_PLATFORM", "cpu")
    env.setdefault("VERL_ENGINE_DEVICE", "cuda")  # verl registers no FSDP engine for device "cpu"
    for key, value in _RENDEZVOUS.items():
        env.setdefault(key, value)
    env.setdefault("MASTER_PORT", str(free_port()))


def cpu_torchrun_process_group_init(original: Any) -> Any:
    """Wrap verl's ``initialize_global_process_group``: on a CPU platform, the same call with ``cpu:gloo`` once."""
    if getattr(original, "__verl_search_bridge__", False):
        return original

    @functools.wraps(original)
    def initialize_global_process_group(timeout_second: int = 36000) -> tuple[int, int, int]:
        import torch.distributed
        from verl.utils.device import get_device_name

        if get_device_name() != "cpu":
            return original(timeout_second=timeout_second)
        torch.distributed.init_process_group(
            backend=CPU_BACKEND,
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    initialize_global_process_group.__verl_search_bridge__ = True
    return initialize_global_process_group


def bridge_torchrun_process_group(distributed: Any) -> None:
    """Bind the wrapper in ``verl.utils.distributed`` (before the SFT trainer runs); checks verl's version."""
    check_verl_version()
    distributed.initialize_global_process_group = cpu_torchrun_process_group_init(
        distributed.initialize_global_process_group
    )


def main(argv: list[str] | None = None) -> int:
    prepare_environment()
    import verl.utils.distributed as distributed

    bridge_torchrun_process_group(distributed)
    from verl.trainer import sft_trainer

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    sft_trainer.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
