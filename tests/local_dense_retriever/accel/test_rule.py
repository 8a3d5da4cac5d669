"""When the pre-scan runs: the rule read from the index's shape, the CPU's flags and its RAM; what a named pre-scan
needs, refused with the way out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from local_dense_retriever.accel import rule
from local_dense_retriever.accel.coarse_copy import Bf16Copy
from local_dense_retriever.accel.prescan import Prescan
from local_dense_retriever.accel.rule import chosen_copy, prescan_for
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.torch_flat import TorchFlatIndex

CPU = torch.device("cpu")
AMX = frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"})  # Sapphire Rapids
ZEN4 = frozenset({"avx512f", "avx512_vnni", "avx512_bf16"})  # VNNI and AVX512-BF16, no AMX
ZEN3 = frozenset({"avx2", "fma"})
LARGE, WIKI18 = (2_000_000, 384), (21_015_324, 768)  # wiki-18 with e5


def choose(prefilter="auto", shape=LARGE, flags=AMX, memory=256 << 30, dtype="auto", device=CPU):
    return chosen_copy(prefilter, device, dtype, shape, flags=flags, memory=memory)


def test_auto_pre_scans_large_float32_cpu_indexes_in_bf16_with_amx_and_in_int8_with_vnni():
    assert choose() == "bfloat16"
    assert choose(flags=ZEN4) == ("int8" if rule.int8_sums_exact() else None)  # without AMX bf16 is slower
    assert choose(flags=ZEN3) is None  # no fast coarse matmul at all
    assert choose(shape=(rule.MIN_ROWS - 1, 768)) is None  # the encoder bounds a smaller index's batches
    assert choose(dtype="bfloat16") is None  # the index itself is bf16: nothing to filter
    assert choose("off") is None
    assert choose(device=torch.device("cuda")) is None
    # wiki-18's bf16 copy (32 GB) is more than a quarter of 64 GB; on 256 GB it is on
    assert choose(shape=WIKI18, memory=64 << 30) is None
    assert choose(shape=WIKI18) == "bfloat16"


def test_a_named_pre_scan_runs_where_the_cpu_has_its_instructions_and_is_refused_elsewhere():
    assert choose("bfloat16", shape=(10, 8), flags=ZEN4) == "bfloat16"  # named: whatever the size
    if rule.int8_sums_exact():
        assert choose("int8", shape=(10, 8), flags=AMX) == "int8"
    with pytest.raises(IndexLoadError, match="--index_prefilter int8 needs avx512_vnni or amx_int8 .*lacks"):
        choose("int8", flags=ZEN3)
    with pytest.raises(IndexLoadError, match="--index_prefilter bfloat16 needs avx512_bf16 or amx_bf16"):
        choose("bfloat16", flags=ZEN3)
    with pytest.raises(IndexLoadError, match="pre-scans a float32 index on the CPU; this index is float16 on cuda"):
        choose("bfloat16", device=torch.device("cuda"))
    with pytest.raises(ValueError, match="prefilter must be auto, off, bfloat16 or int8"):
        choose("int4")


def test_a_pre_scan_wraps_only_a_float32_index_on_the_cpu(rng):
    vectors = rng.standard_normal((50, 8)).astype(np.float32)
    wrap = Prescan.wrapper(Bf16Copy)
    with pytest.raises(IndexLoadError, match="a CPU scan wraps a float32 index on the CPU; this one is torch.bfloat16"):
        TorchFlatIndex(vectors, device=CPU, dtype="bfloat16", cpu_scan=wrap)


def test_prescan_for_gives_the_index_its_scan_or_none():
    assert prescan_for("off", CPU, "auto", LARGE) is None
    assert prescan_for("auto", CPU, "auto", (1_000, 8)) is None
