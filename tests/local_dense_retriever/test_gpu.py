"""CUDA paths: the torch index in half precision on the GPU and the fp16 encoder agree with the fp32 CPU results."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from local_dense_retriever.index.torch_flat import TorchFlatIndex

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _model_path() -> Path:
    if os.environ.get("VERL_SEARCH_TEST_MODEL"):
        return Path(os.environ["VERL_SEARCH_TEST_MODEL"])
    from local_dense_retriever.toy.embedded_default import bundled_minilm_path

    return bundled_minilm_path()


def test_cuda_fp16_index_matches_cpu_fp32():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50_000, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = torch.from_numpy(vectors[:256] + 0.05 * rng.standard_normal((256, 384)).astype(np.float32))
    cpu = TorchFlatIndex(vectors, device=torch.device("cpu"))
    gpu = TorchFlatIndex(vectors, device=torch.device("cuda"))  # auto dtype: float16 on CUDA
    assert "float16" in gpu.describe() and "cuda" in gpu.describe()
    c_scores, c_ids = cpu.search(queries, 10)
    g_scores, g_ids = gpu.search(queries.cuda(), 10)
    assert (g_ids[:, 0] == np.arange(256)).all() and (c_ids[:, 0] == np.arange(256)).all()
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(c_ids, g_ids, strict=True)])
    assert overlap > 0.95
    np.testing.assert_allclose(g_scores, c_scores, atol=5e-3)


def test_cuda_fp32_index_is_exact():
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((20_000, 64)).astype(np.float32)
    queries = torch.from_numpy(rng.standard_normal((32, 64)).astype(np.float32))
    _, c_ids = TorchFlatIndex(vectors, device=torch.device("cpu")).search(queries, 5)
    _, g_ids = TorchFlatIndex(vectors, device=torch.device("cuda"), dtype="float32").search(queries, 5)
    np.testing.assert_array_equal(c_ids, g_ids)


def test_fp16_cuda_encoder_matches_cpu():
    from local_dense_retriever.encoder import HFEncoder

    texts = ["Who founded the Krasthellai Academy?", "a river that flows into the sea", "x"]
    cpu = HFEncoder(_model_path(), device="cpu", dtype="float32").encode(texts)
    gpu_encoder = HFEncoder(_model_path(), device="cuda")
    assert next(gpu_encoder.model.parameters()).dtype == torch.float16
    gpu = gpu_encoder.encode(texts)
    assert gpu.dtype == torch.float32 and gpu.device.type == "cuda"
    cos = torch.nn.functional.cosine_similarity(cpu, gpu.cpu().float(), dim=-1)
    assert (cos > 0.999).all()


def test_cuda_grouped_topk_is_the_cpu_one_pass_selection():
    """The two-pass selection a GPU scan uses gives, on CUDA, what one pass gives on the CPU, ties included."""
    from local_dense_retriever.index.topk import block_topk, grouped_topk

    rng = np.random.default_rng(2)
    for values in (rng.standard_normal((64, 200_003)), rng.integers(0, 40, (64, 200_003))):
        scores = torch.from_numpy(values.astype(np.float32)).half()
        want_s, want_i = block_topk(scores.float(), 10, 7)
        got_s, got_i = grouped_topk(scores.cuda(), 10, 7)
        np.testing.assert_array_equal(got_i.cpu().numpy(), want_i.numpy())
        np.testing.assert_array_equal(got_s.float().cpu().numpy(), want_s.numpy())
