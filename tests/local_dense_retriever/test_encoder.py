"""The plain encoder: e5/bge prefixes and pooling, a text's vector whatever its batch, shapes padded so the CPU's
kernel caches stay bounded, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def memory_stats_available() -> bool:
    from local_dense_retriever.memory import heap_stats

    return heap_stats() is not None


def cpu_has_bf16() -> bool:
    from local_dense_retriever.config import native_bf16

    return native_bf16()


def test_encoder_prefixes_and_pooling(minilm_path):
    from local_dense_retriever.encoder import BGE_QUERY_INSTRUCTION, HFEncoder, text_prefixes

    assert text_prefixes("e5", "intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert text_prefixes("bge", "BAAI/bge-large-en-v1.5") == (BGE_QUERY_INSTRUCTION, "")
    assert text_prefixes("minilm", str(minilm_path)) == ("", "")
    cls = HFEncoder(minilm_path, pooling="cls", device="cpu")
    mean = HFEncoder(minilm_path, pooling="mean", device="cpu")
    a, b = cls.encode(["a river"]), mean.encode(["a river"])
    assert a.shape == b.shape == (1, 384)
    assert not torch.allclose(a, b)
    e5 = HFEncoder(minilm_path, retriever_name="e5", device="cpu")  # e5 naming turns the prefixes on
    assert not torch.allclose(e5.encode(["a river"]), mean.encode(["a river"]))
    assert torch.allclose(e5.encode(["a river"], is_query=False), mean.encode(["passage: a river"]), atol=1e-5)


def test_missing_model_is_a_clear_error(tmp_path):
    from local_dense_retriever.encoder import EncoderError, HFEncoder

    with pytest.raises(EncoderError, match="cannot load encoder"):
        HFEncoder(tmp_path / "no-model-here", device="cpu")


@pytest.mark.parametrize("shape_multiple", [1, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_batches_encode_like_single_texts(minilm_path, toy_questions, dtype, shape_multiple):
    """A text's vector doesn't depend on the batch it was encoded in (nor on the padding of its shape): to float
    rounding in float32, to bf16 rounding in bf16."""
    from local_dense_retriever.encoder import HFEncoder

    encoder = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype=dtype, shape_multiple=shape_multiple)
    assert next(encoder.model.parameters()).dtype == getattr(torch, dtype)
    questions = [q["question"] for q in toy_questions]
    texts = (questions * (70 // len(questions) + 1))[:70] + ["x", "a much longer query " * 20]
    together = encoder.encode(texts)
    alone = torch.cat([encoder.encode([t]) for t in texts[::9]])
    assert together.shape == (72, 384) and together.dtype == torch.float32
    if dtype == "float32":
        torch.testing.assert_close(together[::9], alone, atol=1e-5, rtol=1e-4)
    else:
        assert (torch.nn.functional.cosine_similarity(together[::9], alone, dim=-1) > 0.999).all()
        torch.testing.assert_close(together.norm(dim=-1), torch.ones(72))


def test_padded_shapes_bound_the_kernels_compiled(minilm_path, toy_questions):
    """With shape_multiple 8 the matmuls see a handful of shapes whatever the batch sizes and lengths (oneDNN compiles
    and caches kernels per shape), and the padding never reaches the caller."""
    from local_dense_retriever.encoder import HFEncoder

    rng = np.random.default_rng(0)
    questions = [q["question"] for q in toy_questions]
    batches = [list(rng.choice(questions, size=int(n))) for n in rng.integers(1, 33, size=40)]
    alone = None
    seen: dict[int, set] = {}
    for multiple in (1, 8):
        encoder = HFEncoder(
            minilm_path, retriever_name="minilm", device="cpu", dtype="float32", shape_multiple=multiple
        )
        shapes = seen.setdefault(multiple, set())
        first = encoder.model.encoder.layer[0].intermediate.dense
        first.register_forward_pre_hook(lambda _m, args, s=shapes: s.add(tuple(args[0].shape[:-1])))
        vectors = [encoder.encode(batch) for batch in batches]
        assert [v.shape for v in vectors] == [(len(b), 384) for b in batches]
        alone = vectors if alone is None else alone
        for v, a in zip(vectors, alone, strict=True):  # the same vectors, padded or not
            torch.testing.assert_close(v, a, atol=1e-5, rtol=1e-4)
    assert len(seen[8]) < len(seen[1]) / 2, (len(seen[8]), len(seen[1]))


KERNEL_CACHE_PROBE = """
import sys
from local_dense_retriever.encoder import HFEncoder
from local_dense_retriever.memory import heap_stats, release_free_memory

cache = None if sys.argv[2] == "default" else int(sys.argv[2])
encoder = HFEncoder(sys.argv[1], retriever_name="minilm", device="cpu", dtype="bfloat16", kernel_cache=cache)
encoder.encode(["warm up"] * 4)
release_free_memory()
before = heap_stats()["in_use"]
for rows in range(5, 29):  # 24 batch sizes: 24 input shapes, each compiled into a few new kernels
    encoder.encode(["who wrote the first opera"] * rows)
release_free_memory()
print(heap_stats()["in_use"] - before)
"""


@pytest.mark.skipif(
    not memory_stats_available() or not cpu_has_bf16(), reason="oneDNN bf16 kernels and glibc 2.33+ heap stats"
)
def test_a_bounded_kernel_cache_keeps_the_heap_flat_as_batch_shapes_vary(minilm_path):
    """Every new batch shape compiles kernels that torch caches (oneDNN, ideep), 1024 of each by default: a retriever
    that sees ever more batch sizes grows for hours. The encoder's kernel cache bound keeps that growth small."""
    import os
    import subprocess
    import sys

    from local_dense_retriever.memory import KERNEL_CACHE_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_VARIABLES}  # each run in a fresh process:
    grown = {}  # the caches' capacities are read once per process
    for cache in ("default", "8"):
        out = subprocess.run([sys.executable, "-c", KERNEL_CACHE_PROBE, str(minilm_path), cache], env=env,
                             capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        grown[cache] = int(out.stdout.split()[-1]) / 2**20
    assert grown["default"] > 20 and grown["8"] < grown["default"] / 4, grown


def test_the_encoder_accepts_a_max_length_off_its_shape_multiple_and_odd_texts(minilm_path):
    """The tokenizer refuses to pad to a multiple that max_length is not one of: such a config still serves."""
    from local_dense_retriever.encoder import HFEncoder

    enc = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype="float32", max_length=250,
                    shape_multiple=4)  # fmt: skip
    texts = ["   ", "\t\n", "Ünïcödé ünd àccents — «quotes» 東京 🙂", "x" * 3000, "word " * 400, "a", "", "", "", ""]
    vectors = enc.encode(texts)
    assert vectors.shape == (10, 384) and torch.allclose(vectors.norm(dim=1), torch.ones(10))
