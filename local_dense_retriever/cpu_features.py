"""What this CPU's matmuls can do: AMX tiles (bf16 and int8 matmuls 2-4x faster than float32), VNNI (int8 dot
products with int32 sums, about 3x float32 in a flat scan)."""

from __future__ import annotations

import functools

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


#: the int8 values of full-range weights (symmetric: -128, with no positive twin, is never used)
FULL_LEVELS = 127
#: weights within +-64, whose pair sums stay exact in the 16-bit adds of the int8 path without VNNI (AVX2)
SEVEN_BIT_LEVELS = 63


@functools.cache
def int8_matmul_exact(weight_max: int = FULL_LEVELS) -> bool:
    """Whether ``torch._int_mm``'s int32 sums are exact here for inputs in [-127, 127] and weights in
    [-``weight_max``, ``weight_max``]. With VNNI or AMX they are. Without (AVX2 alone, AVX512 without VNNI, or oneDNN
    held to those by ``ONEDNN_MAX_CPU_ISA``) oneDNN adds pairs of int8 products in 16 bits, which saturate for full
    range weights (the int8 query encoder then gave NaN vectors) but not for weights within +-64. Checked once per
    process and range on extreme values."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (32, 256), generator=generator, dtype=torch.int8)
    b = torch.randint(-weight_max, weight_max + 1, (256, 32), generator=generator, dtype=torch.int8)
    a[0], b[:, 0], a[1], b[:, 1] = 127, weight_max, -127, weight_max
    try:
        got = torch._int_mm(a, b)
    except RuntimeError:
        return False
    return torch.equal(got, a.int() @ b.int())


def exact_int8_levels() -> int | None:
    """The widest weight range (:data:`FULL_LEVELS` or :data:`SEVEN_BIT_LEVELS`) whose ``torch._int_mm`` sums are
    exact here with inputs in [-127, 127], or None where even 7-bit weights saturate."""
    for levels in (FULL_LEVELS, SEVEN_BIT_LEVELS):
        if int8_matmul_exact(levels):
            return levels
    return None
