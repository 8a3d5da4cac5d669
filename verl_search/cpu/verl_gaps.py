"""Bridges for the two verl 0.9.x gaps that stop ``main_ppo`` on a CPU; the CPU plugin applies them.

1. ``initialize_global_process_group_ray`` builds the backend ``cpu:gloo,cpu:gloo`` on a CPU, which torch refuses;
   the bridge passes ``backend="cpu:gloo"`` (bound before ``verl.workers.engine_workers`` imports the name).
2. verl's FSDP2 engine pins the ref model's ``CPUOffloadPolicy``, which needs an accelerator; the bridge binds, in the
   engine module only, a subclass that never pins.

Invariant: both are applied only on the CPU platform and only to a verl whose version we checked
(:data:`SUPPORTED_VERL`); anything else raises :class:`UnsupportedVerlError` naming the version.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from verl_search.errors import UnsupportedVerlError
from verl_search.import_hook import after_import

SUPPORTED_VERL = "0.9."
CPU_BACKEND = "cpu:gloo"
DISTRIBUTED_MODULE = "verl.utils.distributed"
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
WORKERS_MODULE = "verl.workers.engine_workers"


def check_verl_version() -> str:
    """The installed verl's version; raises unless it is one whose internals these bridges were checked against."""
    from importlib.metadata import version

    installed = version("verl")
    if not installed.startswith(SUPPORTED_VERL):
        raise UnsupportedVerlError(
            f"verl {installed} is installed; verl_search's CPU backend bridges gaps of verl {SUPPORTED_VERL}x only "
            "(verl_search/cpu/verl_gaps.py): check them against this verl before running on a CPU"
        )
    return installed


def cpu_process_group_init(original: Any) -> Any:
    """Wrap verl's ``initialize_global_process_group_ray`` so a CPU platform gets ``cpu:gloo`` once."""
    if getattr(original, "__verl_search_bridge__", False):
        return original

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        if backend is None:
            from verl.utils.device import get_device_name

            if get_device_name() == "cpu":
                backend = CPU_BACKEND
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__verl_search_bridge__ = True
    return initialize_global_process_group_ray


def unpinned_offload_policy(policy_cls: type) -> type:
    """A subclass of torch's ``CPUOffloadPolicy`` that ignores ``pin_memory=True`` (no accelerator to pin for)."""
    if getattr(policy_cls, "__verl_search_bridge__", False):
        return policy_cls

    class UnpinnedCPUOffloadPolicy(policy_cls):
        __verl_search_bridge__ = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    UnpinnedCPUOffloadPolicy.__name__ = UnpinnedCPUOffloadPolicy.__qualname__ = "UnpinnedCPUOffloadPolicy"
    return UnpinnedCPUOffloadPolicy


def bridge_process_group(distributed: Any) -> None:
    """Gap 1: bind the wrapper in ``verl.utils.distributed`` (and in ``engine_workers`` if already imported)."""
    distributed.initialize_global_process_group_ray = cpu_process_group_init(
        distributed.initialize_global_process_group_ray
    )
    workers = sys.modules.get(WORKERS_MODULE)
    if workers is not None:
        workers.initialize_global_process_group_ray = distributed.initialize_global_process_group_ray


def bridge_offload_policy(module: Any) -> None:
    """Gap 2: rebind ``CPUOffloadPolicy`` inside verl's FSDP engine module."""
    module.CPUOffloadPolicy = unpinned_offload_policy(module.CPUOffloadPolicy)


def apply() -> None:
    """Apply both bridges (gap 2 when verl's FSDP engine module is imported); raises on an unchecked verl."""
    check_verl_version()
    after_import(DISTRIBUTED_MODULE, bridge_process_group)
    after_import(ENGINE_MODULE, bridge_offload_policy)
