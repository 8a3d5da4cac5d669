"""The backend rule, read from the device (CUDA, or the CPU's flags), never timed. ``auto`` device: CUDA when torch
sees a GPU, else the CPU. ``auto`` encoder: float16 on CUDA; on a CPU bfloat16 where its flags have ``avx512_bf16`` or
``amx_bf16``, else float32 (``--no_fp16``: float32; a named precision is kept). ``auto`` flat index (torch backend):
float16 on CUDA, float32 on the CPU.
"""

from __future__ import annotations

import functools
from typing import get_args

import torch

from local_dense_retriever.config import Precision
from local_dense_retriever.errors import EncoderError

#: CPU flags of native bf16 matmuls (AVX-512 BF16, AMX)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags the CPU reports."""
    return frozenset(cpu_info().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name, or "unknown cpu"."""
    return cpu_info().get("model name", "unknown cpu")


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU with ``flags`` (this one's by default) has bf16 matmuls; torch's own check without cpuinfo."""
    if flags is not None or cpu_info():
        return bool((cpu_flags() if flags is None else flags) & set(BF16_FLAGS))
    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check is not None and check() for check in checks)


def resolve_device(device: str) -> torch.device:
    """'auto' → cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EncoderError("--device cuda was asked for but torch sees no CUDA GPU")
    return torch.device(device)


def encoder_dtype(requested: str, device: torch.device, flags: frozenset[str] | None = None) -> torch.dtype:
    """The encoder's precision under the rule above (``flags``: the CPU's, this one's by default)."""
    if requested == "auto":
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if native_bf16(flags) else torch.float32
    if requested not in get_args(Precision):
        raise EncoderError(f"unknown encoder dtype {requested!r}: use auto, float32, float16 or bfloat16")
    return getattr(torch, requested)


def index_dtype(requested: str, device: torch.device) -> str:
    """A flat index's precision under the rule above."""
    if requested == "auto":
        return "float16" if device.type == "cuda" else "float32"
    return requested
