"""Process memory of the service: give the C heap's free pages back to the OS now and then, and report the heap.

Invariant: glibc's allocator keeps its defaults (its dynamic mmap and trim thresholds), so the encoder's and the
search's per-batch buffers are reused from the heap instead of being mapped, faulted in and unmapped on every call;
what the heap holds free, including the holes that batches of varied shapes leave, is returned every
``malloc_trim_s`` seconds by ``malloc_trim(0)``, so the process's RSS follows what is in use. On other C libraries
nothing changes and the stats are None.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os

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


#: torch's CPU kernel caches, read once per process at its first kernel: oneDNN's compiled primitives, ideep's
#: primitive descriptors (one entry per op and input shape each, default capacity 1024)
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(entries: int) -> dict[str, str]:
    """Cap torch's CPU kernel caches at ``entries`` each, unless the environment already sets them; the capacities in
    force. Effective only before the process's first oneDNN kernel (the first forward pass on a CPU)."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(entries))
    return {name: os.environ[name] for name in KERNEL_CACHE_VARIABLES}


#: madvise advice that drops a range's pages from this process (Linux); for a file mapping they stay in the page cache
MADV_DONTNEED = 4


def release_mapped_pages(array) -> bool:
    """Drop this process's pages of the read-only file mapping under ``array`` (a ``numpy.memmap`` opened with mode
    'r'): RSS falls by what reading it mapped, the file's pages stay in the page cache (the kernel reclaims them
    when memory is short) and fault back in when read. Anything else, or a C library without ``madvise``: False, and
    nothing is done (on anonymous memory the advice would discard data)."""
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
    """Bytes of the C heap: ``in_use`` (allocated), ``free`` (held by malloc, not in use), ``mapped`` (large blocks
    mapped on their own), and the process's ``rss``, split where Linux says so into ``rss_anon`` (memory of its own:
    the heap, tensors) and ``rss_file`` (pages of mapped files: libraries, weights, a memory-mapped corpus or index,
    which the kernel can drop and read again); None without glibc 2.33+. Growth of ``in_use`` is a leak; growth of
    ``free`` is retention the next trim returns; ``rss_file`` grows as more of the mapped files is read, up to their
    size."""
    if not _HAS_MALLINFO2:
        return None
    info = _LIBC.mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "mapped": info.hblkhd, **resident_memory()}


#: /proc/self/status lines read by resident_memory, and their keys
_RESIDENT_FIELDS = {"VmRSS:": "rss", "RssAnon:": "rss_anon", "RssFile:": "rss_file"}


def resident_memory() -> dict[str, int]:
    """The process's resident set ``rss`` and its parts ``rss_anon`` and ``rss_file``, in bytes, from one read of
    ``/proc/self/status`` (lines like ``RssAnon:\t  573004 kB``)."""
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
