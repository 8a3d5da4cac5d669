"""The GPU memory this server holds on each GPU it uses (GET /health ``gpus``), for a training launch beside it.
Invariant: only those GPUs are read (none without GPUs); a figure that cannot be measured is null, never a guess."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class CudaMemory(Protocol):
    """What the report reads of ``torch.cuda`` (a test gives a fake one: the one seam where no GPU exists)."""

    def get_device_properties(self, device: int) -> Any: ...

    def memory_reserved(self, device: int) -> int: ...


def gpu_uuid(properties: Any) -> str:
    """The GPU's UUID as nvidia-smi and CUDA_VISIBLE_DEVICES write it (``GPU-8f3c...``; a MIG slice's ``MIG-...``)."""
    text = str(properties.uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


@functools.cache
def _nvml():
    """NVML (the nvidia-ml-py package), initialised once; None where it is missing or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # not installed, no driver, an old driver: the figure is then null
        logger.info("NVML unavailable (%s): /health reports torch's reserved memory only", e)
        return None
    return pynvml


def nvml_process_bytes(uuid: str) -> int | None:
    """GPU memory NVML counts for this process on the GPU ``uuid``, or None where NVML cannot tell."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # NVMLError of any kind: this figure is not available on this GPU
        return None
    pid = os.getpid()
    used = [p.usedGpuMemory for p in processes if p.pid == pid and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def gpu_report(
    ordinals: Sequence[int],
    *,
    cuda: CudaMemory | None = None,
    process_bytes: Callable[[str], int | None] = nvml_process_bytes,
) -> list[dict[str, Any]]:
    """One entry per GPU in ``ordinals`` (this process's numbering), as /health ``gpus`` lists them."""
    if not ordinals:
        return []
    if cuda is None:
        import torch

        cuda = torch.cuda
    report = []
    for i in ordinals:
        props = cuda.get_device_properties(i)
        uuid = gpu_uuid(props)
        report.append(
            {
                "index": i,
                "uuid": uuid,
                "name": props.name,
                "total_bytes": int(props.total_memory),
                "reserved_bytes": int(cuda.memory_reserved(i)),
                "process_bytes": process_bytes(uuid),
            }
        )
    return report
