"""What this CPU's matmuls can do: AMX tiles (bf16 and int8 matmuls 2-4x faster than float32), VNNI (int8 dot
products with int32 sums, about 3x float32 in a flat scan)."""

from __future__ import annotations

import torch


def _probe(name: str) -> bool:
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def cpu_has_amx() -> bool:
    """True on CPUs with AMX tiles (bf16 matmuls there run ~2x faster than fp32 in the encoder, 3-4x in a flat scan)."""
    return _probe("_is_amx_tile_supported")


def cpu_has_vnni() -> bool:
    """True on CPUs with AVX512-VNNI (int8 dot products into int32: an int8 flat scan ~3x faster than float32's)."""
    return _probe("_is_vnni_supported")
