"""Bridges for the places where SGLang and verl 0.9's SGLang rollout assume a CUDA build, so that verl's own SGLang
rollout (``actor_rollout_ref.rollout.name=sglang``) runs on SGLang's torch-native CPU path without ``sgl-kernel``.

1. A few modules on the engine's import path import torchvision at import time, and PyPI's torchvision (a CUDA
   build) does not import beside ``torch==2.13.0+cpu``: their own imports get a stand-in ``torchvision`` whose every
   name raises when called (only image inputs use them); once each has run, ``torchvision`` is as absent as before,
   so transformers and every other importer still see none.
2. transformers 5 serves ``AutoImageProcessor`` only with torchvision, and ``sglang.srt.configs`` registers its
   multimodal models' image processors at import time: without torchvision the registration is skipped (no image
   processor can run here), the processors themselves still register.
3. SGLang picks its CPU engine (torch-native layers, the CPU device) from ``SGLANG_USE_CPU_ENGINE=1`` in each of its
   processes, which verl sets only while one process imports sglang: the trainer's weight-sync client
   (``ServerArgs`` without a device) and the server's scheduler need it for good, so it is set in every process.
4. verl's weight sync serialises each tensor through SGLang's patched torch reduction, which rewrites the device
   field of a CUDA IPC handle and fails on the shorter reduction of a CPU tensor; torch's own CPU reduction passes a
   file descriptor that only a process of the same multiprocessing family may take. A CPU tensor travels by value
   instead (``torch.save`` bytes, rebuilt by ``torch.storage._load_from_bytes``, which SGLang's unpickler allows).

Invariant: nothing is applied unless SGLang is installed without an importable torchvision; a SGLang version other
than :data:`SUPPORTED_SGLANG` raises :class:`UnsupportedSglangError`. The GPU path never reaches any of this.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import sys
from importlib import metadata
from types import ModuleType
from typing import Any

from verl_search.cpu.stand_ins import StandIns
from verl_search.errors import UnsupportedSglangError
from verl_search.import_hook import after_import

SUPPORTED_SGLANG = "0.5.12"
# per absent package, the modules on the engine's import path that import it unconditionally at import time
STAND_INS: dict[str, frozenset[str]] = {
    "torchvision": frozenset({"sglang.srt.utils.common", "sglang.srt.multimodal.internvl_utils"}),
    "sgl_kernel": frozenset({"sglang.srt.mem_cache.memory_pool_host"}),
}
CONFIGS_UTILS_MODULE = "sglang.srt.configs.utils"
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
PATCH_TORCH_MODULE = "sglang.srt.utils.patch_torch"


def installed_sglang_without_torchvision() -> str | None:
    """SGLang's version when it is installed and torchvision is not importable, else None."""
    try:
        installed = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None
    if "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is not None:
        return None
    return installed


def check_sglang_version(installed: str) -> str:
    """``installed`` when these bridges were checked against it; raises :class:`UnsupportedSglangError` otherwise."""
    if installed != SUPPORTED_SGLANG:
        raise UnsupportedSglangError(
            f"sglang {installed} is installed; verl_search bridges verl's SGLang rollout on a CPU to sglang "
            f"{SUPPORTED_SGLANG} only (verl_search/cpu/sglang_gaps.py): check them against this SGLang first"
        )
    return installed


def prime_transformers() -> None:
    """Cache transformers' torchvision check before a stand-in exists, so transformers never counts one."""
    from transformers.utils import is_torchvision_available

    is_torchvision_available()


def bridge_absent_imports() -> None:
    """Gap 1: put the stand-in finder first, once."""
    if not any(isinstance(finder, StandIns) for finder in sys.meta_path):
        sys.meta_path.insert(0, StandIns(STAND_INS, before=prime_transformers))


def skip_image_processors_without_torchvision(module: ModuleType) -> None:
    """Gap 2: ``register_image_processor`` does nothing while transformers has no torchvision. Idempotent."""
    original = module.register_image_processor
    if getattr(original, "__verl_search_bridge__", False):
        return

    @functools.wraps(original)
    def register_image_processor(config: Any, image_processor: Any) -> None:
        from transformers.utils import is_torchvision_available

        if is_torchvision_available():
            original(config, image_processor)

    register_image_processor.__verl_search_bridge__ = True
    module.register_image_processor = register_image_processor


def by_value(tensor: Any) -> tuple[Any, tuple[bytes]]:
    """A pickle reduction of a CPU tensor that holds its bytes (any process can rebuild it)."""
    import torch
    import torch.storage

    buffer = io.BytesIO()
    torch.save(tensor.detach(), buffer)
    return torch.storage._load_from_bytes, (buffer.getvalue(),)


def send_cpu_tensors_by_value(module: ModuleType) -> None:
    """Gap 4: SGLang's ``_reduce_tensor_modified`` sends tensors that are not on CUDA by value. Idempotent."""
    original = module._reduce_tensor_modified
    if getattr(original, "__verl_search_bridge__", False):
        return

    @functools.wraps(original)
    def _reduce_tensor_modified(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tensor.is_cuda:
            return original(tensor, *args, **kwargs)
        return by_value(tensor)

    _reduce_tensor_modified.__verl_search_bridge__ = True
    module._reduce_tensor_modified = _reduce_tensor_modified


def apply() -> bool:
    """Apply every bridge where SGLang runs without torchvision; returns whether it did. Raises on an unchecked one."""
    installed = installed_sglang_without_torchvision()
    if installed is None:
        return False
    check_sglang_version(installed)
    bridge_absent_imports()
    os.environ.setdefault(CPU_ENGINE_ENV, "1")
    after_import(CONFIGS_UTILS_MODULE, skip_image_processors_without_torchvision)
    after_import(PATCH_TORCH_MODULE, send_cpu_tensors_by_value)
    return True
