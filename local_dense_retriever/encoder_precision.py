"""The query encoder's precision on a CPU under ``auto``, and :func:`encoder_for`, the one place encoders are made.

``auto`` picks by what the CPU can do fast and oneDNN may use (:mod:`~local_dense_retriever.cpu_features`): bfloat16
where bf16 matmuls exist and a start-up probe finds them faster than float32; int8 where VNNI exists without AMX and
no bf16 matmuls do, or where both exist without AMX and int8 is measured faster; float32 elsewhere. Each measurement
is taken once per model, CPU, torch version and thread count and remembered (:mod:`precision_cache`).

Invariant: ``auto`` never gives a passage encoder (the index builder's) int8, and a named precision is kept, or
refused with the reason where its matmuls are several times slower than float32's on this CPU
(:func:`~local_dense_retriever.cpu_features.slow_precision`): never served slowly without a word.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.cpu_features import (  # best_seconds: imported from here too
    FULL_LEVELS,
    best_seconds,
    cpu_flags,
    cpu_has_amx,
    cpu_has_vnni,
    exact_int8_levels,
    onednn_may_use,
    slow_precision,
)
from local_dense_retriever.errors import EncoderError

if TYPE_CHECKING:
    from local_dense_retriever.encoder import HFEncoder

logger = logging.getLogger(__name__)

#: CPU flags of hardware bf16 matmuls (AVX-512 BF16 on Intel Cooper Lake+ and AMD Zen 4+; AMX on Sapphire Rapids+),
#: each with the instruction family oneDNN must be allowed (``cpu_features.onednn_may_use``) to use it
BF16_CPU_FLAGS = {"amx_bf16": "amx", "avx512_bf16": "avx512_bf16"}
#: bfloat16 is chosen on a CPU only when it encodes the probe batch at least this much faster than float32
BF16_MIN_SPEEDUP = 1.15
#: the start-up probe: a batch shaped like rollout queries (64 queries of about 16 tokens)
PROBE_BATCH = ["who was the president of the country when the famous bridge over the river was built"] * 64


def cpu_bf16_flags() -> list[str]:
    """The bf16 instruction flags this CPU reports (``/proc/cpuinfo``; torch's AMX probe elsewhere) and oneDNN may use
    (none under ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI``, say: bf16 matmuls would then run slower than float32's)."""
    flags = cpu_flags()
    found = [f for f, family in BF16_CPU_FLAGS.items() if f in flags and onednn_may_use(family)]
    return found or (["amx_bf16"] if cpu_has_amx() else [])


def choose_cpu_precision(flags: list[str], timings: dict[str, float] | None) -> tuple[torch.dtype, str]:
    """float32 or bfloat16 for a CPU encoder, and why: bf16 needs hardware support (``flags``) and, when the start-up
    probe ran (``timings``: seconds per probe batch for 'float32' and 'bfloat16'), to be measurably faster."""
    if not flags:
        return torch.float32, "float32: this CPU has no bf16 instructions (avx512_bf16/amx_bf16)"
    if timings is None:
        return torch.bfloat16, f"bfloat16: the CPU has {'+'.join(flags)}"
    speedup = timings["float32"] / timings["bfloat16"]
    measured = (
        f"a {len(PROBE_BATCH)}-query batch took {timings['bfloat16'] * 1e3:.0f} ms in bfloat16, "
        f"{timings['float32'] * 1e3:.0f} ms in float32 ({speedup:.2f}x) on this CPU ({'+'.join(flags)})"
    )
    if speedup >= BF16_MIN_SPEEDUP:
        return torch.bfloat16, f"bfloat16: {measured}"
    return torch.float32, f"float32: {measured}; bf16 is not worth its rounding below {BF16_MIN_SPEEDUP}x"


#: where bf16 matmuls exist but AMX does not, 'auto' keeps int8 over the float choice only when it encodes the probe
#: batch at least this much faster (int8 vectors sit at cosine ~0.999 to float32's, bf16's closer)
INT8_MIN_SPEEDUP = 1.10


def int8_contends(device: torch.device) -> bool:
    """Whether an int8 query encoder can be the fast one on ``device``: a CPU with VNNI and exact 8-bit int8 sums whose
    oneDNN may not use AMX (with AMX bf16 is faster: int8 0.84x in an A/B)."""
    return (
        device.type == "cpu"
        and not cpu_has_amx()
        and cpu_has_vnni()
        and exact_int8_levels() == FULL_LEVELS
        and slow_precision("int8") is None
    )


def _int8_or_none(make: Callable[[str], HFEncoder]) -> HFEncoder | None:
    """``make("int8")``, or None (with a warning) where the int8 layers cannot run: 'auto' then stays float."""
    try:
        return make("int8")
    except EncoderError as e:
        logger.warning("query encoder: int8 cannot run here, so 'auto' decides among the float precisions: %s", e)
        return None


def seconds_per_probe_batch(encoders: Mapping[str, HFEncoder]) -> dict[str, float]:
    """Seconds per encode of :data:`PROBE_BATCH` through each encoder's served path (:func:`best_seconds`)."""
    return best_seconds({name: functools.partial(e.encode, PROBE_BATCH) for name, e in encoders.items()})


def _int8_or_float(config: ServerConfig, make: Callable[[str], HFEncoder]) -> HFEncoder:
    """The faster of the int8 query encoder and the float one ``auto`` chooses (bf16 or float32), on a CPU with bf16
    matmuls and VNNI but no AMX (AMD Zen 4, Cooper Lake): timed once per model, CPU, torch version and thread count,
    then remembered (:mod:`precision_cache`). The float one where the int8 layers cannot run."""
    from transformers import AutoConfig

    from local_dense_retriever import precision_cache

    try:
        model_config = AutoConfig.from_pretrained(str(config.retriever_model)).to_json_string()
    except (OSError, ValueError):
        return make("auto")  # the float encoder's load says what is wrong with the model
    flags = cpu_bf16_flags()
    key = precision_cache.probe_key(f"{config.retriever_model} (int8 or auto)", model_config, flags)
    timings = precision_cache.cached_timings(key, names=("int8", "auto"))
    if timings is not None and timings["auto"] < INT8_MIN_SPEEDUP * timings["int8"]:
        return make("auto")
    floating = make("auto") if timings is None else None
    int8 = _int8_or_none(make)
    if int8 is None:
        return floating or make("auto")
    if floating is None:
        return int8  # int8 measured faster at an earlier start
    timings = seconds_per_probe_batch({"int8": int8, "auto": floating})
    precision_cache.remember(key, timings)
    speedup = timings["auto"] / timings["int8"]
    chosen = int8 if speedup >= INT8_MIN_SPEEDUP else floating
    kept = "" if chosen is int8 else f"; int8 is kept from {INT8_MIN_SPEEDUP}x"
    logger.info(
        "query encoder %s: a %d-query batch took %.0f ms in int8, %.0f ms in %s (%.2fx) on this CPU (%s, VNNI, no "
        "AMX)%s", chosen.precision, len(PROBE_BATCH), timings["int8"] * 1e3, timings["auto"] * 1e3,
        floating.precision, speedup, "+".join(flags), kept,
    )  # fmt: skip
    return chosen


def encoder_for(
    config: ServerConfig, *, device: str | None = None, max_length: int | None = None, queries: bool = True
) -> HFEncoder:
    """The encoder ``config`` describes (model, prefixes, pooling, precision): the one place the server and the index
    builder make it, so an index is never encoded with other pooling or prefixes than the server queries it with.
    ``device`` and ``max_length`` default to the server's (``config.device``, ``config.query_max_length``).
    ``queries``: the server's query encoder, which ``auto`` makes int8 where :func:`int8_contends` and no bf16 matmuls
    exist (Cascade Lake, Ice Lake: the float32 encoder's matmuls already run near the CPU's float32 peak and bound the
    batched server; with oneDNN held to AVX512-VNNI, 11.1x the per-request mode in int8 against 7.1-8.5x in float32,
    recall@3 on the toy QA set unchanged; ``benchmarks/RESULTS.md``), or where bf16 matmuls exist without AMX and int8
    is measured faster (:func:`_int8_or_float`); float, with a warning, where the int8 layers cannot run (no C++
    compiler, an unsupported model). False (the index builder): ``auto`` never means int8."""

    from local_dense_retriever.encoder import HFEncoder, resolve_device

    def make(dtype: str) -> HFEncoder:
        return HFEncoder(
            config.retriever_model,
            retriever_name=config.retriever_name,
            pooling=config.resolved_pooling(),
            device=device or config.device,
            dtype=dtype,
            max_length=max_length or config.query_max_length,
            shape_multiple=config.encoder_shape_multiple,
            kernel_cache=config.encoder_kernel_cache,
            packed=config.encoder_packed,
        )

    dtype = config.requested_encoder_dtype()
    resolved = resolve_device(device or config.device)
    if dtype in ("bfloat16", "int8") and resolved.type == "cpu" and (slow := slow_precision(dtype)) is not None:
        raise EncoderError(
            f"--encoder_dtype {dtype}: {slow}, so the encoder would run several times slower than in float32 "
            "(use --encoder_dtype auto, which measures what is fast here, or float32)"
        )
    if not queries or dtype != "auto" or not int8_contends(resolved):
        return make(dtype)
    if cpu_bf16_flags():  # bf16 matmuls without AMX: the faster of the two, measured
        return _int8_or_float(config, make)
    logger.info("query encoder: int8 under 'auto' (this CPU has VNNI and no bf16 matmuls)")
    return _int8_or_none(make) or make(dtype)
