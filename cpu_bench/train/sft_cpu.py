"""``python -m cpu_bench.train.sft_cpu [hydra overrides]``: verl's own SFT trainer (``verl.trainer.sft_trainer``,
config ``sft_trainer_engine``) on the CPU backend, world size 1, without torchrun.

verl 0.9.1's ``sft_trainer.run_sft`` calls ``verl.utils.distributed.initialize_global_process_group``, which builds the
backend ``cpu:gloo,cpu:gloo`` on the CPU platform (torch refuses the duplicate): gap 3 of
:mod:`verl_search.cpu.verl_gaps`, whose bridge this launcher applies. It also sets the single-process rendezvous
variables torchrun would set, and selects the CPU platform.
Invariant: nothing is changed unless the platform is ``cpu``; verl's files are never edited.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cpu_bench.background_server import free_port

# What torchrun --nproc_per_node=1 would export; a free port is picked unless MASTER_PORT is set.
_RENDEZVOUS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def prepare_environment(env: dict[str, str] | Any = os.environ) -> None:
    """Select the CPU platform and the FSDP engines and set single-process rendezvous defaults."""
    env.setdefault("VERL_PLATFORM", "cpu")
    env.setdefault("VERL_ENGINE_DEVICE", "cuda")  # verl registers no FSDP engine for device "cpu"
    for key, value in _RENDEZVOUS.items():
        env.setdefault(key, value)
    env.setdefault("MASTER_PORT", str(free_port()))


def main(argv: list[str] | None = None) -> int:
    prepare_environment()
    import verl.utils.distributed as distributed

    from verl_search.cpu.verl_gaps import bridge_torchrun_process_group

    bridge_torchrun_process_group(distributed)
    from verl.trainer import sft_trainer

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    sft_trainer.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
