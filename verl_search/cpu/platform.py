"""The ``cpu`` verl platform: gloo collectives, device ``cpu``, and no-op stand-ins for the accelerator API.

Invariant: nothing here touches CUDA; ``current_device()`` is the string ``"cpu"`` because verl moves tensors with
``.to(get_device_id())``, and every ``torch.<device>`` call verl makes (caches, streams, events, memory, RNG) is a
harmless no-op or the CPU equivalent.
"""

from __future__ import annotations

import contextlib
import time
import types
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase

PLATFORM_NAME = "cpu"


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class _Event:
    """Stands in for ``torch.cuda.Event``: records wall time so ``elapsed_time`` stays meaningful."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    synchronize = wait = _noop

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return ((end._t or 0.0) - (self._t or 0.0)) * 1000.0


class _Stream:
    """Stands in for ``torch.cuda.Stream``; work on a CPU is already ordered."""

    __init__ = synchronize = wait_stream = wait_event = _noop

    def record_event(self, event: Any = None) -> _Event:
        event = event or _Event()
        event.record()
        return event


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _build_device_module() -> types.ModuleType:
    module = types.ModuleType("verl_search_cpu_device")
    for name in ("set_device", "synchronize", "empty_cache", "ipc_collect", "reset_peak_memory_stats"):
        setattr(module, name, _noop)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, lambda *a, **k: 0)
    for name in ("current_stream", "default_stream"):
        setattr(module, name, lambda *a, **k: _Stream())
    for name in ("stream", "device"):
        setattr(module, name, lambda *a, **k: contextlib.nullcontext())
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: PLATFORM_NAME
    module.mem_get_info = _mem_get_info
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    module.Stream = _Stream
    module.Event = _Event
    module.get_device_name = lambda *a, **k: "cpu"
    module.get_device_capability = lambda *a, **k: (None, None)
    module.is_bf16_supported = lambda *a, **k: True
    module.memory = types.SimpleNamespace(_set_allocator_settings=_noop)
    return module


DEVICE_MODULE = _build_device_module()


def _constant(value: Any) -> Any:
    return lambda self, *args, **kwargs: value


class CpuPlatform(PlatformBase):
    """verl platform for CPU-only hosts (selected by ``VERL_PLATFORM=cpu``; never auto-detected)."""

    def __init__(self) -> None:
        from verl_search.cpu.verl_gaps import check_verl_version

        check_verl_version()

    device_name = vendor_name = property(_constant(PLATFORM_NAME))
    device_module = property(_constant(DEVICE_MODULE))
    is_available = _constant(True)
    is_platform_available = is_ipc_supported = _constant(False)
    current_device = _constant(PLATFORM_NAME)
    device_count = _constant(1)
    get_device_capability = _constant((None, None))
    communication_backend_name = _constant("gloo")
    visible_devices_envvar = _constant("CUDA_VISIBLE_DEVICES")
    ray_resource_name = _constant("GPU")  # logical GPUs (ray_init.num_gpus) place one worker per rank
    ray_noset_envvars = _constant(["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"])
    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = cudart = _noop

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield
