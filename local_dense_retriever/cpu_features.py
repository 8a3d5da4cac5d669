"""What this CPU's matmuls can do: AMX tiles (bf16 and int8 matmuls 2-4x faster than float32), VNNI (int8 dot
products with int32 sums, about 3x float32 in a flat scan), AVX-512 BF16; each as oneDNN, which runs those matmuls,
is allowed to use it (``ONEDNN_MAX_CPU_ISA``)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping

import torch

#: oneDNN's instruction-set caps (``ONEDNN_MAX_CPU_ISA``, formerly ``DNNL_MAX_CPU_ISA``; any case), lowest first with
#: aliases side by side; oneDNN runs as if uncapped under any other value, as under ``ALL``
ONEDNN_ISA_CAPS = (
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16",
    "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16",
    "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2",
)  # fmt: skip
_AMX_CAPS = ("AVX512_CORE_AMX", "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512_AMX_2")
_BF16_CAPS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX10_2_512", *_AMX_CAPS)
#: per instruction family this module asks about, the caps that leave oneDNN that family
ISA_CAPS_KEEPING = {"amx": _AMX_CAPS, "avx512_bf16": _BF16_CAPS, "avx512_vnni": ("AVX512_CORE_VNNI", *_BF16_CAPS)}


def onednn_isa_cap() -> str | None:
    """The instruction-set cap oneDNN runs under (one of :data:`ONEDNN_ISA_CAPS`), or None where it has none."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return cap if cap in ONEDNN_ISA_CAPS else None


def onednn_may_use(family: str) -> bool:
    """Whether oneDNN's cap (:func:`onednn_isa_cap`) leaves it ``family`` (a key of :data:`ISA_CAPS_KEEPING`): a
    matmul the hardware could run with AMX runs without it when oneDNN is held to AVX-512, and is then slower than
    float32's, so the fast paths are chosen by what oneDNN may use, not by what the CPU has."""
    cap = onednn_isa_cap()
    return cap is None or cap in ISA_CAPS_KEEPING[family]


def cpu_flags() -> set[str]:
    """The instruction-set flags the CPU reports in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _probe(name: str) -> bool:
    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


def cpu_has_amx() -> bool:
    """True on CPUs with AMX tiles (bf16 matmuls there run ~2x faster than fp32 in the encoder, 3-4x in a flat scan)
    that oneDNN may use."""
    return onednn_may_use("amx") and _probe("_is_amx_tile_supported")


def cpu_has_vnni() -> bool:
    """True on CPUs with AVX512-VNNI (int8 dot products into int32: an int8 flat scan ~3x faster than float32's) that
    oneDNN may use."""
    return onednn_may_use("avx512_vnni") and _probe("_is_vnni_supported")


#: the int8 values of full-range weights (symmetric: -128, with no positive twin, is never used)
FULL_LEVELS = 127
#: weights within +-64, whose pair sums stay exact in the 16-bit adds of the int8 path without VNNI (AVX2)
SEVEN_BIT_LEVELS = 63


def best_seconds(runs: Mapping[str, Callable[[], object]], repeats: int = 3) -> dict[str, float]:
    """Each run's best time of ``repeats``, after a warm-up each. The runs take turns, so a machine that slows down
    or speeds up during the measurement (other processes, frequency changes) tilts none of them."""
    best = dict.fromkeys(runs, float("inf"))
    for rep in range(repeats + 1):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            if rep:  # the first pass of each is its warm-up
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


#: a precision named explicitly (``--encoder_dtype``, ``--index_prefilter``) whose matmuls take at least this many
#: times float32's on this CPU is refused: the server would answer several times slower than in float32. Where the
#: hardware has the instructions, a bf16 or int8 matmul takes 0.3-1.5x float32's time; where it has not, torch falls
#: back to plain loops (on an AMD Zen 3: int8 10-45x, bf16 18-88x at the encoder's shapes; ``benchmarks/RESULTS.md``)
SLOW_MATMUL_FACTOR = 4.0
#: the matmul :func:`matmul_slowdown` times: a batch of 64 tokens through a 384-wide layer (MiniLM's)
_PROBE_SHAPE = (64, 384, 384)


@functools.cache
def matmul_slowdown(dtype: str) -> float:
    """How many times float32's time a matmul takes in ``dtype`` (``bfloat16``, or ``int8`` through ``torch._int_mm``)
    on this CPU, at :data:`_PROBE_SHAPE`, best of three after a warm-up, the two taking turns; once per process (under
    100 ms where it is slow). On an AMD Zen 3 (AVX2, no VNNI) torch 2.13 runs ``torch._int_mm`` without oneDNN
    (``ONEDNN_VERBOSE=1`` shows no primitive) in a loop 10-45x slower than float32 at the encoder's shapes, and bf16
    matmuls 18-88x (``benchmarks/matmul_precisions.py``). On a CPU with VNNI it takes oneDNN's kernels, also when
    ``ONEDNN_MAX_CPU_ISA`` holds oneDNN to AVX2, which is why that cap does not stand for a CPU without VNNI here."""
    m, k, n = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    if dtype == "int8":
        a8, b8 = ((x * 30).round().clamp(-127, 127).to(torch.int8) for x in (a, b))
        run = functools.partial(torch._int_mm, a8, b8)
    elif dtype == "bfloat16":
        run = functools.partial(torch.mm, a.bfloat16(), b.bfloat16())
    else:
        raise ValueError(f"no matmul probe for {dtype!r}")
    best = best_seconds({"float32": functools.partial(torch.mm, a, b), dtype: run}, repeats=3)
    return best[dtype] / max(best["float32"], 1e-9)


def slow_precision(dtype: str) -> str | None:
    """Why ``dtype``'s matmuls are too slow to serve with on this CPU (:data:`SLOW_MATMUL_FACTOR`), or None."""
    try:
        factor = matmul_slowdown(dtype)
    except RuntimeError:  # no kernel at all: the layers' own start-up check says so
        return None
    if factor < SLOW_MATMUL_FACTOR:
        return None
    fast_with = "AVX512-VNNI or AMX" if dtype == "int8" else "AVX512-BF16 or AMX"
    article = "an" if dtype == "int8" else "a"
    took = f"{article} {dtype} matmul takes {factor:.0f}x float32's time on this CPU"
    return f"{took} (torch's fast ones need {fast_with})"


@functools.cache
def int8_matmul_exact(weight_max: int = FULL_LEVELS) -> bool:
    """Whether ``torch._int_mm``'s int32 sums are exact here for inputs in [-127, 127] and weights in
    [-``weight_max``, ``weight_max``]. With VNNI or AMX they are, and so are those of torch's own slow loop on CPUs
    without VNNI (:func:`matmul_slowdown`). oneDNN held to AVX2 or AVX-512 by ``ONEDNN_MAX_CPU_ISA`` on a CPU with VNNI
    adds pairs of int8 products in 16 bits, which saturate for full range weights (the int8 query encoder then gave
    NaN vectors) but not for weights within +-64. Checked once per process and range on extreme values."""
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
