"""When the pre-scan runs (``--index_prefilter``): a rule read from the index, the CPU's flags and its RAM, never timed.

- ``off``: never. ``bfloat16`` or ``int8``: always, for a float32 flat index on the CPU whose CPU has the instructions
  (``amx_bf16`` or ``avx512_bf16``; ``avx512_vnni`` or ``amx_int8`` with exact int8 sums); otherwise refused.
- ``auto`` (the default): for a float32 flat index on the CPU of at least :data:`MIN_ROWS` rows whose copy takes at
  most :data:`MAX_MEMORY_SHARE` of the RAM: bfloat16 where the CPU has ``amx_bf16``, else int8 where it has
  ``avx512_vnni`` or ``amx_int8``; off elsewhere (without AMX a bf16 matmul is slower than float32's). At that size
  the scan's memory traffic, which the copy halves (bf16) or quarters (int8), bounds a batch.
"""

from __future__ import annotations

import functools

import torch

from local_dense_retriever.accel.coarse_copy import Bf16Copy, CoarseCopy, Int8Copy
from local_dense_retriever.accel.prescan import Prescan
from local_dense_retriever.config import BF16_FLAGS, cpu_flags, index_dtype
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.flat_file import STAGING_BYTES
from local_dense_retriever.index.scan import ScanWrapper
from local_dense_retriever.memory import physical_memory

#: the coarse copies by ``--index_prefilter`` name
COPIES: dict[str, type[CoarseCopy]] = {"bfloat16": Bf16Copy, "int8": Int8Copy}
#: the CPU flags each copy's matmul needs to be fast
NEEDS = {"bfloat16": BF16_FLAGS, "int8": ("avx512_vnni", "amx_int8")}
#: under 'auto', smaller indexes are scanned in float32 alone: the encoder, not the scan, bounds their batches
MIN_ROWS = 1 << 20
#: under 'auto', the coarse copy may take at most this share of the machine's memory
MAX_MEMORY_SHARE = 0.25


@functools.cache
def int8_sums_exact() -> bool:
    """Whether ``torch._int_mm``'s int32 sums are exact here for int8 values in [-127, 127] (oneDNN held to an older
    instruction set by ``ONEDNN_MAX_CPU_ISA`` adds pairs of products in 16 bits, which saturate); checked once."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (32, 256), generator=generator, dtype=torch.int8)
    b = torch.randint(-127, 128, (256, 32), generator=generator, dtype=torch.int8)
    a[0], b[:, 0], a[1], b[:, 1] = 127, 127, -127, 127
    try:
        return torch.equal(torch._int_mm(a, b), a.int() @ b.int())
    except RuntimeError:
        return False


def fast_here(name: str, flags: frozenset[str]) -> bool:
    """Whether a CPU with ``flags`` has the instructions ``name``'s copy needs (:data:`NEEDS`; int8: exact sums)."""
    return bool(flags & set(NEEDS[name])) and (name != "int8" or int8_sums_exact())


def auto_copy(flags: frozenset[str]) -> str | None:
    """The copy ``auto`` takes on a CPU with ``flags``, if any: bfloat16 with AMX, else int8 with VNNI."""
    if "amx_bf16" in flags:
        return "bfloat16"
    return "int8" if fast_here("int8", flags) else None


def chosen_copy(
    prefilter: str,
    device: torch.device,
    dtype: str,
    shape: tuple[int, int],
    *,
    flags: frozenset[str] | None = None,
    memory: int | None = None,
) -> str | None:
    """The copy (``bfloat16`` or ``int8``) an index of ``shape`` is pre-scanned in, or None (the module's rule);
    ``flags`` and ``memory``: the CPU's flags and RAM, this machine's by default."""
    flags = cpu_flags() if flags is None else flags
    if prefilter not in ("auto", "off", *COPIES):
        raise ValueError(f"prefilter must be auto, off, bfloat16 or int8, not {prefilter!r}")
    applies = device.type == "cpu" and index_dtype(dtype, device) == "float32"
    if prefilter in COPIES:
        if not applies:
            raise IndexLoadError(
                f"--index_prefilter {prefilter} pre-scans a float32 index on the CPU; this index is "
                f"{index_dtype(dtype, device)} on {device.type} (use --index_prefilter off or auto)"
            )
        if not fast_here(prefilter, flags):
            raise IndexLoadError(
                f"--index_prefilter {prefilter} needs {' or '.join(NEEDS[prefilter])}"
                f"{' with exact int8 sums' if prefilter == 'int8' else ''}, which this CPU lacks: the pre-scan would "
                "be slower than the float32 scan (use --index_prefilter off or auto)"
            )
        return prefilter
    if prefilter == "off" or not applies:
        return None
    chosen, (rows, dim) = auto_copy(flags), shape
    if chosen is None or rows < MIN_ROWS:
        return None
    memory = physical_memory() if memory is None else memory
    fits = rows * dim * COPIES[chosen].dtype.itemsize <= MAX_MEMORY_SHARE * memory
    return chosen if fits else None


def prescan_for(
    prefilter: str, device: torch.device, dtype: str, shape: tuple[int, int], *, step_bytes: int = STAGING_BYTES
) -> ScanWrapper | None:
    """What ``TorchFlatIndex(cpu_scan=...)`` takes for ``--index_prefilter`` over an index of ``shape``, or None
    where it scans exactly; the copy is made ``step_bytes`` of float32 rows at a time."""
    chosen = chosen_copy(prefilter, device, dtype, shape)
    if chosen is None:
        return None
    return Prescan.wrapper(COPIES[chosen], auto=prefilter == "auto", step_bytes=step_bytes)
