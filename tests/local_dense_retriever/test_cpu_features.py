"""The fast paths go by what oneDNN may use: a user who holds oneDNN to an older instruction set
(``ONEDNN_MAX_CPU_ISA``) on a CPU with AMX gets the choices a CPU without AMX gets, not bf16 matmuls that oneDNN would
then run slower than float32's."""

from __future__ import annotations

import platform
import sys

import pytest
import torch

from local_dense_retriever import cpu_features, encoder_precision
from local_dense_retriever.encoder_precision import choose_cpu_precision, cpu_bf16_flags
from local_dense_retriever.index import prefilter_choice

#: what a Sapphire Rapids reports: AMX, AVX-512 BF16 and VNNI
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.fixture
def amx_cpu(monkeypatch):
    """This process on a CPU with AMX, whatever it runs on; oneDNN uncapped until a test sets a cap."""
    monkeypatch.setattr(cpu_features, "_probe", {"_is_amx_tile_supported": True, "_is_vnni_supported": True}.get)
    monkeypatch.setattr(encoder_precision, "cpu_flags", lambda: set(SAPPHIRE_RAPIDS))
    monkeypatch.setattr(prefilter_choice, "int8_matmul_exact", lambda: True)
    for module in (prefilter_choice, encoder_precision):  # its int8 and bf16 matmuls have kernels (oneDNN's)
        monkeypatch.setattr(module, "slow_precision", lambda dtype: None)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


def choices() -> tuple[bool, bool, list[str], str | None]:
    """AMX, VNNI, the encoder's bf16 flags and the index's automatic pre-scan, as the server would decide them."""
    auto_prefilter = prefilter_choice.auto_prefilter_dtype()
    return cpu_features.cpu_has_amx(), cpu_features.cpu_has_vnni(), cpu_bf16_flags(), auto_prefilter


@pytest.mark.parametrize("cap", [None, "ALL", "all", "NOT_AN_ISA"])  # oneDNN runs uncapped under the last three too
def test_without_a_cap_the_cpus_own_features_decide(amx_cpu, monkeypatch, cap):
    if cap is not None:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu_features.onednn_isa_cap() is None
    assert choices() == (True, True, ["amx_bf16", "avx512_bf16"], "bfloat16")


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        ("AVX512_CORE_AMX", (True, True, ["amx_bf16", "avx512_bf16"], "bfloat16")),
        ("AVX512_CORE_BF16", (False, True, ["avx512_bf16"], "int8")),  # AMD Zen 4's set: bf16 is timed, scan in int8
        ("AVX512_CORE_VNNI", (False, True, [], "int8")),  # Cascade Lake's: a float32 encoder, an int8 pre-scan
        ("avx512_core", (False, False, [], None)),  # Skylake-SP's (oneDNN reads the cap in any case)
        ("AVX2", (False, False, [], None)),
    ],
)
def test_a_cap_rules_out_what_onednn_may_not_use(amx_cpu, monkeypatch, cap, expected):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert choices() == expected
    if not expected[2]:  # the encoder's auto precision: float32 without a probe, and the log says why
        assert choose_cpu_precision(cpu_bf16_flags(), None) == (
            torch.float32,
            "float32: this CPU has no bf16 instructions (avx512_bf16/amx_bf16)",
        )


def test_the_former_variable_name_is_read_too(amx_cpu, monkeypatch):
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert choices() == (False, False, [], None)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # the newer name wins where both are set
    assert choices() == (True, True, ["amx_bf16", "avx512_bf16"], "bfloat16")


@pytest.mark.skipif(platform.machine() != "x86_64" or sys.platform != "linux", reason="reads x86 flags on Linux")
def test_the_cpu_flags_are_read_from_this_machine():
    assert "sse2" in cpu_features.cpu_flags()  # every x86-64 CPU has it
    assert set(cpu_bf16_flags()) <= {"amx_bf16", "avx512_bf16"}


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_the_matmul_probe_times_the_named_precision_against_float32(dtype):
    factor = cpu_features.matmul_slowdown(dtype)
    assert 0 < factor < float("inf")
    assert cpu_features.matmul_slowdown(dtype) == factor  # measured once per process
    with pytest.raises(ValueError, match="no matmul probe for 'float16'"):
        cpu_features.matmul_slowdown("float16")


def test_a_precision_is_slow_where_its_matmuls_take_four_times_float32s(monkeypatch):
    """A CPU without VNNI (an AMD Zen 3: torch's int8 matmul there is a plain loop, ~50x float32's time) against one
    with it; bf16 without bf16 hardware likewise."""
    factors = {"int8": 48.0, "bfloat16": 1.2}
    monkeypatch.setattr(cpu_features, "matmul_slowdown", factors.get)
    assert cpu_features.slow_precision("int8") == (
        "an int8 matmul takes 48x float32's time on this CPU (torch's fast ones need AVX512-VNNI or AMX)"
    )
    assert cpu_features.slow_precision("bfloat16") is None
    factors.update(int8=0.6, bfloat16=8.0)
    assert cpu_features.slow_precision("int8") is None
    assert "a bfloat16 matmul takes 8x" in cpu_features.slow_precision("bfloat16")
    assert "need AVX512-BF16 or AMX" in cpu_features.slow_precision("bfloat16")


SLOW = "an int8 matmul takes 48x float32's time on this CPU (torch's fast ones need AVX512-VNNI or AMX)"


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_a_named_precision_that_is_slow_here_is_refused_before_the_model_loads(monkeypatch, tmp_path, dtype):
    """A user who names int8 (or bf16) on a CPU without the instructions gets the reason and the way out, not a server
    tens of times slower; 'auto' never takes such a precision."""
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.errors import EncoderError

    monkeypatch.setattr(encoder_precision, "slow_precision", lambda d: SLOW.replace("int8", d))
    config = ServerConfig(retriever_model=str(tmp_path / "no-model-here"), device="cpu", encoder_dtype=dtype)
    with pytest.raises(EncoderError) as e:
        encoder_precision.encoder_for(config)
    assert str(e.value).startswith(f"--encoder_dtype {dtype}: a") and "48x float32's time" in str(e.value)
    assert str(e.value).endswith("(use --encoder_dtype auto, which measures what is fast here, or float32)")
    assert not encoder_precision.int8_contends(torch.device("cpu"))


@pytest.mark.parametrize("coarse", ["int8", "bfloat16"])
def test_a_named_pre_scan_that_is_slow_here_is_refused(monkeypatch, coarse):
    from local_dense_retriever.errors import IndexLoadError

    monkeypatch.setattr(prefilter_choice, "slow_precision", lambda d: SLOW.replace("int8", d) if d == coarse else None)
    with pytest.raises(IndexLoadError, match=f"--index_prefilter {coarse}: an? {coarse} matmul takes 48x.*off or auto"):
        prefilter_choice.resolve_prefilter(coarse, torch.device("cpu"), "auto", (200_000, 384))
    if coarse == "int8":
        assert prefilter_choice.auto_prefilter_dtype() != "int8"
