"""Where a flat index's rows go: one contiguous shard per device, every visible GPU or the one CPU. Invariant: the
loader and the memory plan place rows with these functions alone, so the plan logged is the split made."""

from __future__ import annotations

import numpy as np
import torch


def shard_devices(device: torch.device) -> list[torch.device]:
    """Every visible GPU (CUDA_VISIBLE_DEVICES) for any CUDA ``device``, else the one CPU."""
    if device.type == "cuda":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


def shard_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` of ``parts`` contiguous shards of ``rows`` rows, as even as whole rows allow."""
    bounds = np.linspace(0, rows, parts + 1).astype(np.int64)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
