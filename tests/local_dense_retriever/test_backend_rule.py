"""The backend rule: fp16 on CUDA; on a CPU bf16 where its flags say it has bf16 matmuls, else float32; read from the
device, never timed, nothing written to disk."""

from __future__ import annotations

import pytest
import torch

from local_dense_retriever.config import (
    ServerConfig,
    cpu_flags,
    cpu_model,
    encoder_dtype,
    index_dtype,
    native_bf16,
    resolve_device,
)
from local_dense_retriever.errors import EncoderError

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
ZEN4 = frozenset({"avx512f", "avx512_vnni", "avx512_bf16"})
ZEN3 = frozenset({"avx2", "fma"})


def test_auto_is_fp16_on_cuda_and_bf16_only_on_cpus_with_native_bf16():
    assert encoder_dtype("auto", CUDA, ZEN3) == torch.float16
    assert encoder_dtype("auto", CPU, SAPPHIRE_RAPIDS) == torch.bfloat16
    assert encoder_dtype("auto", CPU, ZEN4) == torch.bfloat16
    assert encoder_dtype("auto", CPU, ZEN3) == torch.float32
    assert encoder_dtype("auto", CPU, frozenset({"amx_bf16"})) == torch.bfloat16


def test_a_named_precision_is_kept_and_an_unknown_one_refused():
    assert encoder_dtype("float32", CUDA) == torch.float32
    assert encoder_dtype("bfloat16", CPU, ZEN3) == torch.bfloat16
    with pytest.raises(EncoderError, match="unknown encoder dtype 'int4'"):
        encoder_dtype("int4", CPU)
    assert ServerConfig().requested_encoder_dtype() == "auto"
    assert ServerConfig(fp16=False).requested_encoder_dtype() == "float32"  # --no_fp16
    assert ServerConfig(fp16=False, encoder_dtype="bfloat16").requested_encoder_dtype() == "bfloat16"


def test_a_flat_index_is_fp16_on_cuda_and_float32_on_the_cpu():
    assert (index_dtype("auto", CUDA), index_dtype("auto", CPU), index_dtype("bfloat16", CPU)) == (
        "float16",
        "float32",
        "bfloat16",
    )


def test_this_cpu_is_read_from_its_flags():
    assert isinstance(cpu_model(), str) and cpu_model()
    assert native_bf16() == bool(cpu_flags() & {"avx512_bf16", "amx_bf16"}) or not cpu_flags()
    assert resolve_device("cpu") == CPU
    if not torch.cuda.is_available():
        assert resolve_device("auto") == CPU
        with pytest.raises(EncoderError, match="--device cuda was asked for but torch sees no CUDA GPU"):
            resolve_device("cuda")


def test_the_encoder_takes_the_rule_at_once_and_writes_nothing(minilm_path, tmp_path, monkeypatch, caplog):
    """No start-up timing, no probe file: an auto encoder on this CPU is the rule's precision, and the cache folder
    stays empty."""
    from local_dense_retriever.encoder import HFEncoder

    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path))
    with caplog.at_level("INFO", logger="local_dense_retriever"):
        encoder = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype="auto")
    assert encoder.dtype == encoder_dtype("auto", CPU) and encoder.precision in ("bfloat16", "float32")
    assert any(f"in {encoder.precision} on cpu" in r.getMessage() for r in caplog.records)
    assert list(tmp_path.iterdir()) == []
    assert encoder.encode(["who founded it?"]).shape == (1, encoder.dim)
