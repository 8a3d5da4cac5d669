"""Index backends: torch flat IP equals faiss flat IP; faiss serves non-flat files; bm25 builds once, also for servers
starting together; bad files fail."""

from __future__ import annotations

import shutil

import faiss
import numpy as np
import pytest
import torch

from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.bm25 import BM25Search, bm25_dir_for, build_bm25
from local_dense_retriever.index.faiss_index import FaissIndex, blas_threshold, shipped_blas_threshold
from local_dense_retriever.index.torch_flat import TorchFlatIndex
from verl_search.atomic import exclusive

CPU = torch.device("cpu")


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def flat_files(tmp_path, rng):
    vectors = _unit(rng, 2000, 32)
    index = faiss.IndexFlatIP(32)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "flat.index"))
    np.save(tmp_path / "flat.npy", vectors)
    return vectors, tmp_path / "flat.index", tmp_path / "flat.npy"


def test_torch_and_faiss_give_identical_results_on_flat_indexes(flat_files, rng):
    vectors, index_path, npy_path = flat_files
    queries = torch.from_numpy(_unit(rng, 64, 32))
    f_scores, f_ids = FaissIndex(index_path).search(queries, 10)
    for torch_index in (
        TorchFlatIndex.from_file(index_path, device=CPU),
        TorchFlatIndex.from_file(npy_path, device=CPU),
        TorchFlatIndex(vectors, device=CPU, cpu_chunk_rows=300),  # chunked scan + merge
        TorchFlatIndex(vectors, device=CPU, score_bytes=64 * 4 * 170),  # steps of 170 rows: the score-memory bound
    ):
        t_scores, t_ids = torch_index.search(queries, 10)
        np.testing.assert_array_equal(t_ids, f_ids)
        np.testing.assert_allclose(t_scores, f_scores, rtol=1e-5, atol=1e-5)


def test_k_larger_than_index_is_capped(rng):
    index = TorchFlatIndex(_unit(rng, 3, 8), device=CPU)
    scores, ids = index.search(torch.from_numpy(_unit(rng, 2, 8)), 10)
    assert ids.shape == (2, 3) and sorted(ids[0].tolist()) == [0, 1, 2]
    assert (np.diff(scores, axis=1) <= 0).all()


def test_a_bounded_score_buffer_gives_the_unbounded_answer_in_half_precision(rng):
    """Searching a bfloat16 index in steps of a few rows (the bound a GPU shard is scanned under) ranks ties and all
    exactly as one step over every row: coarse bf16 scores tie often, and the tie rule must hold across steps."""
    vectors = _unit(rng, 3000, 16)
    vectors[1500:2000] = vectors[:500]  # exact duplicates: equal scores on both sides of many step boundaries
    queries = torch.from_numpy(_unit(rng, 40, 16))
    whole = TorchFlatIndex(vectors, device=CPU, dtype="bfloat16", score_bytes=1 << 30)
    stepped = TorchFlatIndex(vectors, device=CPU, dtype="bfloat16", score_bytes=40 * 2 * 97)
    assert stepped.scan.rows_per_step(40) == 97
    w_scores, w_ids = whole.search(queries, 10)
    s_scores, s_ids = stepped.search(queries, 10)
    np.testing.assert_array_equal(s_ids, w_ids)
    np.testing.assert_array_equal(s_scores, w_scores)
    assert s_scores.dtype == np.float32


def test_half_precision_keeps_the_nearest_neighbour(flat_files):
    vectors, _, _ = flat_files
    index = TorchFlatIndex(vectors, device=CPU, dtype="bfloat16")
    _, ids = index.search(torch.from_numpy(vectors[:20]), 1)
    assert ids[:, 0].tolist() == list(range(20))


def test_a_faiss_index_has_batches_of_three_queries_or_more_scored_by_blas(flat_files):
    shipped = shipped_blas_threshold()
    assert blas_threshold(384, shipped=shipped) is not None, f"faiss {faiss.__version__} ships a new rule: {shipped}"
    try:
        FaissIndex(flat_files[1])
        assert faiss.cvar.distance_compute_blas_threshold == blas_threshold(32, shipped=shipped)
    finally:
        faiss.cvar.distance_compute_blas_threshold = shipped


def test_the_blas_threshold_is_set_in_the_unit_faiss_counts():
    assert blas_threshold(384, shipped=20) == 3  # faiss before PR #5022: a batch's queries
    assert blas_threshold(384, shipped=128_000) == 3 * 384  # faiss-cpu 1.15: queries x dimension
    assert blas_threshold(384, shipped=800) is None  # a rule not known here: faiss's own value is kept


def test_faiss_backend_serves_hnsw_and_torch_refuses_it(tmp_path, rng):
    vectors = _unit(rng, 500, 16)
    hnsw = faiss.IndexHNSWFlat(16, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    path = tmp_path / "hnsw.index"
    faiss.write_index(hnsw, str(path))
    _, ids = FaissIndex(path).search(torch.from_numpy(vectors[:5]), 3)
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(IndexLoadError, match="not a flat index: use --backend faiss"):
        TorchFlatIndex.from_file(path, device=CPU)


def test_torch_refuses_l2_flat_index(tmp_path, rng):
    index = faiss.IndexFlatL2(4)
    index.add(_unit(rng, 3, 4))
    faiss.write_index(index, str(tmp_path / "l2.index"))
    with pytest.raises(IndexLoadError, match="L2"):
        TorchFlatIndex.from_file(tmp_path / "l2.index", device=CPU)


@pytest.mark.parametrize("content", [b"not an index", b""])
def test_garbage_index_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.index"
    path.write_bytes(content)
    with pytest.raises(IndexLoadError, match="not a faiss index file"):
        FaissIndex(path)
    with pytest.raises(IndexLoadError, match="not a faiss index file"):
        TorchFlatIndex.from_file(path, device=CPU)


def test_missing_index_and_bad_npy(tmp_path):
    with pytest.raises(IndexLoadError, match="not found"):
        TorchFlatIndex.from_file(tmp_path / "none.npy", device=CPU)
    with pytest.raises(IndexLoadError, match="not found"):
        FaissIndex(tmp_path / "none.index")
    np.save(tmp_path / "v.npy", np.zeros(5, dtype=np.float32))
    with pytest.raises(IndexLoadError, match=r"expected \(passages, dim\)"):
        TorchFlatIndex.from_file(tmp_path / "v.npy", device=CPU)


def test_faiss_gpu_without_gpus_is_a_clear_error(flat_files):
    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
        pytest.skip("this machine has faiss GPUs")
    with pytest.raises(IndexLoadError, match="faiss-gpu"):
        FaissIndex(flat_files[1], gpu=True)


def test_bm25_is_built_once_and_reloaded(animal_corpus):
    corpus = CorpusStore(animal_corpus, progress=False)
    index_dir = bm25_dir_for(animal_corpus)
    first = BM25Search(index_dir, corpus, progress=False)
    assert index_dir.is_dir()
    stamp = (index_dir / "params.index.json").stat().st_mtime_ns
    second = BM25Search(index_dir, corpus, progress=False, build=False)
    assert (index_dir / "params.index.json").stat().st_mtime_ns == stamp
    for backend in (first, second):
        _, ids = backend.search(["where does item17 live", "camel"], 3)
        assert ids[0, 0] == 17
        assert {int(i) % 10 for i in ids[1]} == {2}  # camel is animal 2


def test_bm25_missing_index_without_build(tmp_path, animal_corpus):
    with pytest.raises(IndexLoadError, match="no bm25s index"):
        BM25Search(tmp_path / "nothing", CorpusStore(animal_corpus, progress=False), build=False)


@pytest.mark.parametrize(
    ("make", "metric"),
    [
        (faiss.IndexFlatIP, "inner_product"),
        (faiss.IndexFlatL2, "L2"),
        (lambda d: faiss.IndexFlat(d, faiss.METRIC_L1), "other-metric"),
    ],
    ids=["IndexFlatIP", "IndexFlatL2", "IndexFlat L1"],
)
@pytest.mark.parametrize("n", [0, 1, 777])
def test_flat_header_reader_agrees_with_faiss(tmp_path, rng, make, metric, n):
    from local_dense_retriever.index.flat_file import read_flat_header

    d = 24
    index = make(d)
    if n:
        index.add(_unit(rng, n, d))
    path = tmp_path / "x.index"
    faiss.write_index(index, str(path))
    header = read_flat_header(path)
    back = faiss.read_index(str(path))
    assert (header.metric, header.dim, header.ntotal) == (metric, back.d, back.ntotal)
    vectors = np.fromfile(path, dtype=np.float32, count=n * d, offset=header.offset).reshape(n, d)
    np.testing.assert_array_equal(vectors, back.reconstruct_n(0, n) if n else np.zeros((0, d), np.float32))
    if metric == "inner_product":
        np.testing.assert_array_equal(TorchFlatIndex.from_file(path, device=CPU).scan.rows.numpy(), vectors)
    else:
        with pytest.raises(IndexLoadError, match=f"flat {metric} index"):
            TorchFlatIndex.from_file(path, device=CPU)


def test_flat_header_reader_refuses_other_and_broken_files(tmp_path, rng):
    from local_dense_retriever.index.flat_file import read_flat_header

    hnsw = faiss.IndexHNSWFlat(8, 4, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(_unit(rng, 10, 8))
    faiss.write_index(hnsw, str(tmp_path / "hnsw.index"))
    with pytest.raises(IndexLoadError, match="faiss IHNf index, not a flat index"):
        read_flat_header(tmp_path / "hnsw.index")
    flat = faiss.IndexFlatIP(8)
    flat.add(_unit(rng, 10, 8))
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    data = (tmp_path / "flat.index").read_bytes()
    (tmp_path / "cut.index").write_bytes(data[:-4])
    with pytest.raises(IndexLoadError, match="truncated"):
        read_flat_header(tmp_path / "cut.index")


def test_loading_a_large_flat_index_does_not_read_it_into_memory(big_flat_index, load_peak_rss):
    """A 200k x 384 IndexFlatIP (307 MB) written by faiss: start-up maps it, and its peak RSS (the process's own) grows
    far less than the file."""
    rows, grew = load_peak_rss(big_flat_index, "off")
    assert rows == 200_000
    size = big_flat_index.stat().st_size
    assert grew < size // 10, f"peak RSS grew by {grew >> 20} MB loading a {size >> 20} MB index"


def test_equal_scores_come_in_id_order_whatever_the_chunking(rng):
    """Duplicate passages tie exactly: the lower id wins the cut and comes first, chunked or not (the rule the
    sharded Serve mode relies on to merge back to the single index's answer)."""
    base = _unit(rng, 40, 8)
    vectors = np.concatenate([base, base[:5], base, base[:5]])  # rows 0-4 appear four times each
    queries = torch.from_numpy(base[:5])
    expected = [[q, q + 40, q + 45, q + 85] for q in range(5)]
    for chunk in (1 << 18, 7, 45):
        scores, ids = TorchFlatIndex(vectors, device=CPU, cpu_chunk_rows=chunk).search(queries, 3)
        assert ids.tolist() == [row[:3] for row in expected], chunk
        assert (scores[:, 0] == scores[:, 2]).all()


@pytest.mark.parametrize("retained", [1 << 30, 32 * 4 * 700])  # every step reused; steps over 32 queries not kept
def test_reused_score_buffers_give_every_batch_size_and_thread_its_own_answer(flat_files, rng, monkeypatch, retained):
    """Each thread's score buffer is reused from batch to batch (issue 29: a fresh one per batch fragmented the heap):
    batches of growing and shrinking sizes, chunked, and searched from several threads at once must each get the
    answer a fresh index gives them, never rows of an earlier or a concurrent batch."""
    from concurrent.futures import ThreadPoolExecutor

    from local_dense_retriever.index import scan

    monkeypatch.setattr(scan, "RETAINED_SCORE_BYTES", retained)
    vectors, _, _ = flat_files
    shared = TorchFlatIndex(vectors, device=CPU, cpu_chunk_rows=700)
    batches = [torch.from_numpy(_unit(rng, n, 32)) for n in (64, 1, 17, 64, 3, 40, 2, 64)]
    expected = [TorchFlatIndex(vectors, device=CPU, cpu_chunk_rows=700).search(q, 5) for q in batches]
    for _ in range(2):
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda q: shared.search(q, 5), batches * 3))
        for (scores, ids), (want_scores, want_ids) in zip(got, expected * 3, strict=True):
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(scores, want_scores)


def test_servers_starting_together_on_one_corpus_build_the_bm25_index_once(tmp_path, animal_corpus, waiting_process):
    """Two bm25 servers started at once on a corpus without an index both built it, and the second's atomic rename
    onto the first's finished folder failed: now the later one waits for the build, then loads it."""
    corpus_path = tmp_path / "corpus.jsonl"
    shutil.copy(animal_corpus, corpus_path)
    index_dir = bm25_dir_for(corpus_path)
    code = (
        "from pathlib import Path\n"
        "from local_dense_retriever.corpus_store import CorpusStore\n"
        "from local_dense_retriever.index.bm25 import BM25Search\n"
        f"corpus = CorpusStore(Path({str(corpus_path)!r}), progress=False)\n"
        f"_, ids = BM25Search(Path({str(index_dir)!r}), corpus, progress=False).search(['item17'], 1)\n"
        "print(int(ids[0, 0]))\n"
    )
    with exclusive(index_dir.with_name(f".{index_dir.name}.build.lock"), "bm25"):  # this process is the first server
        later = waiting_process(code, "the bm25 index")
        build_bm25(CorpusStore(corpus_path, progress=False), index_dir, progress=False)
    assert later.finish().strip() == "17" and "building bm25 index" not in later.log
