"""Where a flat index's rows go: one contiguous shard per device, every visible GPU or the one CPU.

Invariant: the loader (``TorchFlatIndex``) and the memory plan (``local_dense_retriever.memory_plan``) place rows with
these two functions alone, so the plan logged before a load is the split the load makes.
"""

from __future__ import annotations

import numpy as np
import torch


def shard_devices(device: torch.device) -> list[torch.device]:
    """The devices an index on ``device`` is sharded over: every visible GPU for any CUDA device (which ones are
    visible is CUDA_VISIBLE_DEVICES's choice: launch_retriever.sh's GPUS), else the one CPU."""
    if device.type == "cuda":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


def shard_bounds(rows: int, parts: int) -> list[tuple[int, int]]:
    """Row ranges ``[lo, hi)`` of ``parts`` contiguous shards of ``rows`` rows, as even as whole rows allow."""
    bounds = np.linspace(0, rows, parts + 1).astype(np.int64)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
