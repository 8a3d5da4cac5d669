"""Loading a flat index onto devices or into another dtype streams it: the shards equal the file's rows, every step
goes through one staging buffer of bounded size, and nothing of the file is mapped (the GPU path, run on the CPU)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch

from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.flat_file import vector_file
from local_dense_retriever.index.torch_flat import TorchFlatIndex, index_source
from local_dense_retriever.serve.shards import window as shard_window

CPU = torch.device("cpu")


@pytest.fixture
def files(tmp_path):
    vectors = np.random.default_rng(3).standard_normal((5_003, 24)).astype(np.float32)
    index = faiss.IndexFlatIP(24)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "flat.index"))
    np.save(tmp_path / "flat.npy", vectors)
    return vectors, tmp_path / "flat.index", tmp_path / "flat.npy"


@pytest.mark.parametrize("which", ["faiss", "npy"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_streamed_shards_hold_the_files_rows(files, which, dtype):
    vectors, faiss_path, npy_path = files
    path = faiss_path if which == "faiss" else npy_path
    source = index_source(path, CPU, dtype)
    assert not isinstance(source, np.ndarray)  # converted shards never map the file
    index = TorchFlatIndex(source, device=CPU, dtype=dtype, staging_bytes=7 * 24 * 4)  # 7 rows per step
    shard = index.scan.rows
    assert len(index.devices) == 1 and shard.dtype == getattr(torch, dtype)
    assert torch.equal(shard, torch.from_numpy(vectors).to(getattr(torch, dtype)))


def test_every_step_reuses_one_staging_buffer_of_bounded_size(files):
    _, faiss_path, _ = files
    source = vector_file(faiss_path)
    budget = 1000 * 24 * 4
    bases, rows = set(), []
    for row, block in source.steps(0, source.rows, budget):
        assert block.nbytes <= budget
        bases.add(block.__array_interface__["data"][0])
        rows.append((row, len(block)))
    assert len(bases) == 1  # the same memory every step: host RAM does not grow with the index
    assert rows[0] == (0, 1000) and rows[-1] == (5000, 3) and sum(n for _, n in rows) == 5_003


def test_a_window_streams_only_its_rows(files):
    vectors, faiss_path, _ = files
    window = shard_window(vector_file(faiss_path), 1_000, 2_500)
    index = TorchFlatIndex(window, device=CPU, dtype="bfloat16", staging_bytes=4096)
    assert len(index) == 1_500
    assert torch.equal(index.scan.rows, torch.from_numpy(vectors[1_000:2_500]).to(torch.bfloat16))


def test_float32_on_the_cpu_stays_a_memory_map(files):
    _, faiss_path, _ = files
    assert isinstance(index_source(faiss_path, CPU, "float32"), np.memmap)
    assert isinstance(index_source(faiss_path, CPU, "auto"), np.memmap)


def test_a_file_cut_short_while_streaming_is_a_clear_error(files, tmp_path):
    _, faiss_path, _ = files
    source = vector_file(faiss_path)
    cut = tmp_path / "cut.index"
    cut.write_bytes(faiss_path.read_bytes()[: source.offset + 100 * 24 * 4])
    truncated = type(source)(cut, source.offset, source.rows, source.dim)  # as if cut after the header was read
    with pytest.raises(IndexLoadError, match="truncated while loading"):
        TorchFlatIndex(truncated, device=CPU, dtype="bfloat16")


def test_a_non_float32_npy_cannot_stream(tmp_path):
    np.save(tmp_path / "f64.npy", np.zeros((10, 4)))
    with pytest.raises(IndexLoadError, match="float64 vectors"):
        vector_file(tmp_path / "f64.npy")
