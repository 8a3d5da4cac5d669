"""Which coarse copy, if any, a float32 flat index on the CPU is pre-scanned in (``--index_prefilter``): what a named
choice requires of the index and the CPU, and what ``auto`` picks from this CPU's instructions, the index's size and the
machine's memory.

Invariant: a pre-scan is only ever chosen for a float32 index on the CPU, in a precision this CPU has fast, exact
matmuls for; a named choice that cannot be honoured raises :class:`IndexLoadError` with the reason and the way out.
"""

from __future__ import annotations

import os
from typing import get_args

import torch

from local_dense_retriever.config import Prefilter
from local_dense_retriever.cpu_features import cpu_has_amx, cpu_has_vnni, int8_matmul_exact, slow_precision
from local_dense_retriever.index.base import IndexLoadError
from local_dense_retriever.index.coarse_copy import Bf16Copy, Int8Copy


def resolve_index_dtype(dtype: str, device: torch.device) -> str:
    """``auto``: float16 on GPUs (half the memory, exact enough for ranking), float32 on the CPU."""
    if dtype == "auto":
        return "float16" if device.type == "cuda" else "float32"
    return dtype


#: ``--index_prefilter`` choices: 'auto' pre-scans a float32 CPU index in bf16 on CPUs with AMX, in int8 on CPUs with
#: VNNI and no AMX
PREFILTERS = get_args(Prefilter)
#: the coarse copies a pre-scan can use, by ``--index_prefilter`` name
COPIES: dict[str, type[Bf16Copy] | type[Int8Copy]] = {copy.name: copy for copy in (Bf16Copy, Int8Copy)}
#: under 'auto', smaller indexes are scanned in float32 alone (a scan of this many rows takes well under a millisecond)
PREFILTER_MIN_ROWS = 1 << 15
#: under 'auto', the coarse copy may take at most this share of the machine's memory
PREFILTER_MAX_MEMORY_SHARE = 0.25


def physical_memory() -> int:
    """This machine's RAM in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def auto_prefilter_dtype() -> str | None:
    """The coarse copy this CPU scans fastest, if any is faster than float32: bfloat16 with AMX, int8 with VNNI
    (without AMX a bf16 matmul is slower than float32's: 0.27-0.67x, ``benchmarks/cpu_flat_scan.py``)."""
    if cpu_has_amx():
        return "bfloat16"
    if cpu_has_vnni() and int8_matmul_exact() and slow_precision("int8") is None:  # exact sums, oneDNN's kernels
        return "int8"
    return None


def resolve_prefilter(prefilter: str, device: torch.device, dtype: str, shape: tuple[int, int]) -> str | None:
    """The dtype (``bfloat16`` or ``int8``) of the copy a float32 index of ``shape`` is pre-scanned in
    (``index.prefilter``), or None: ``auto`` as :func:`auto_prefilter_dtype` says where the index has at least
    :data:`PREFILTER_MIN_ROWS` rows and the copy takes at most :data:`PREFILTER_MAX_MEMORY_SHARE` of the RAM;
    ``bfloat16`` and ``int8`` always, if the index is float32 on the CPU."""
    if prefilter not in PREFILTERS:
        raise ValueError(f"prefilter must be one of {PREFILTERS}, not {prefilter!r}")
    applies = device.type == "cpu" and resolve_index_dtype(dtype, device) == "float32"
    if prefilter in COPIES and not applies:
        raise IndexLoadError(
            f"--index_prefilter {prefilter} pre-scans a float32 index on the CPU; this index is "
            f"{resolve_index_dtype(dtype, device)} on {device.type} (use --index_prefilter off or auto)"
        )
    if prefilter in COPIES and applies and (slow := slow_precision(prefilter)) is not None:
        raise IndexLoadError(
            f"--index_prefilter {prefilter}: {slow}, so the pre-scan would be slower than the float32 scan it "
            "stands for (use --index_prefilter off or auto)"
        )
    if prefilter == "int8" and not int8_matmul_exact():
        raise IndexLoadError(
            "--index_prefilter int8 needs exact int8 sums (a CPU with VNNI or AMX); this CPU's int8 matmul "
            "saturates (use --index_prefilter off or auto)"
        )
    if prefilter == "auto":
        chosen = auto_prefilter_dtype()
        if chosen is None or not applies:
            return None
        rows, dim = shape
        fits = rows * dim * COPIES[chosen].dtype.itemsize <= PREFILTER_MAX_MEMORY_SHARE * physical_memory()
        return chosen if rows >= PREFILTER_MIN_ROWS and fits else None
    return prefilter if prefilter in COPIES else None
