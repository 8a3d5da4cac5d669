"""What this CPU's matmuls can do: AMX tiles (bf16 matmuls 2-4x faster than float32)."""

from __future__ import annotations

import torch


def cpu_has_amx() -> bool:
    """True on CPUs with AMX tiles (bf16 matmuls there run ~2x faster than fp32 in the encoder, 3-4x in a flat scan)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False
