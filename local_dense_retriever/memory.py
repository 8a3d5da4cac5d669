"""The memory the server holds: the C heap's free pages back to the OS every ``malloc_trim_s``, the heap and RSS
(/metrics ``memory_bytes``) and each GPU it uses (/health ``gpus``) reported, kernel caches bounded. Invariants: glibc
keeps its default thresholds, so per-batch buffers are reused from the heap; on other C libraries nothing changes and
the heap stats are None; a GPU figure that cannot be measured is null, never a guess."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _glibc() -> tuple[ctypes.CDLL | None, bool]:
    """(the C library if it is glibc, whether it has ``mallinfo2``: glibc 2.33 and later)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None, False
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return None, False
    try:
        libc.mallinfo2.restype = _MallInfo2
    except AttributeError:
        return libc, False
    return libc, True


_LIBC, _HAS_MALLINFO2 = _glibc()


#: torch's CPU kernel caches (oneDNN's compiled primitives, ideep's descriptors), read once at the first kernel
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(entries: int) -> dict[str, str]:
    """Cap torch's CPU kernel caches at ``entries`` each unless the environment sets them (before the first kernel)."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(entries))
    return {name: os.environ[name] for name in KERNEL_CACHE_VARIABLES}


#: madvise advice that drops a range's pages from this process (Linux); for a file mapping they stay in the page cache
MADV_DONTNEED = 4


def release_mapped_pages(array) -> bool:
    """Drop this process's pages of a read-only ``numpy.memmap`` (the page cache keeps them); else False."""
    import numpy as np

    if _LIBC is None or not isinstance(array, np.memmap) or getattr(array, "mode", None) != "r" or not array.nbytes:
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    start = array.__array_interface__["data"][0]
    lo, hi = start - start % page, start + array.nbytes
    return _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED) == 0


def physical_memory() -> int:
    """This machine's RAM in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def release_free_memory() -> bool:
    """``malloc_trim(0)``: the free pages of every arena go back to the OS (True when glibc gave any back)."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False


def heap_stats() -> dict[str, int] | None:
    """Bytes of the C heap (``in_use``, ``free``, ``mapped``) and the process's ``rss``, ``rss_anon`` (its own
    memory) and ``rss_file`` (mapped files: libraries, weights, a mapped corpus or index); None without glibc 2.33+."""
    if not _HAS_MALLINFO2:
        return None
    info = _LIBC.mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "mapped": info.hblkhd, **resident_memory()}


#: /proc/self/status lines read by resident_memory, and their keys
_RESIDENT_FIELDS = {"VmRSS:": "rss", "RssAnon:": "rss_anon", "RssFile:": "rss_file"}


def resident_memory() -> dict[str, int]:
    """The process's ``rss``, ``rss_anon`` and ``rss_file`` in bytes, from one read of ``/proc/self/status``."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in _RESIDENT_FIELDS:
                out[_RESIDENT_FIELDS[parts[0]]] = int(parts[1]) * 1024
    return out


async def release_free_memory_every(interval_s: float) -> None:
    """Run :func:`release_free_memory` every ``interval_s`` seconds off the event loop, until cancelled."""
    if _LIBC is None or interval_s <= 0:
        return
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(release_free_memory)


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
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByUUID(uuid))
    except Exception:  # NVMLError of any kind: this figure is not available on this GPU
        return None
    used = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory is not None]
    return int(sum(used)) if used else None


def gpu_report(
    ordinals: Sequence[int], *, cuda: Any = None, process_bytes: Callable[[str], int | None] = nvml_process_bytes
) -> list[dict[str, Any]]:
    """One entry per GPU in ``ordinals`` (this process's numbering), as /health ``gpus`` lists them; ``cuda``:
    ``torch.cuda`` unless a test gives its own (the one seam where no GPU exists)."""
    if not ordinals:
        return []
    if cuda is None:
        import torch

        cuda = torch.cuda
    report = []
    for i in ordinals:
        props = cuda.get_device_properties(i)
        uuid, reserved = gpu_uuid(props), int(cuda.memory_reserved(i))
        report.append({"index": i, "uuid": uuid, "name": props.name, "total_bytes": int(props.total_memory),
                       "reserved_bytes": reserved, "process_bytes": process_bytes(uuid)})  # fmt: skip
    return report
