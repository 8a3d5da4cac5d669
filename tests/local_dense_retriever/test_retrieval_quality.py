"""Retrieval quality with the real all-MiniLM-L6-v2 and with BM25 on the toy QA set; torch and faiss agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.base import DenseSearch
from local_dense_retriever.index.bm25 import BM25Search, bm25_dir_for
from local_dense_retriever.index.faiss_index import FaissIndex
from local_dense_retriever.index.torch_flat import TorchFlatIndex


def recall_at_k(engine: RetrievalEngine, questions: list[dict], k: int) -> float:
    hits = engine.search([q["question"] for q in questions], k)
    found = [
        bool({d["id"] for d, _ in per_q} & set(q["metadata"]["supporting_ids"]))
        for q, per_q in zip(questions, hits, strict=True)
    ]
    return sum(found) / len(found)


@pytest.fixture(scope="module")
def single_hop(toy_questions) -> list[dict]:
    qs = [q for q in toy_questions if q["metadata"]["hops"] == 1]
    assert len(qs) >= 10
    return qs


@pytest.fixture(scope="module")
def corpus(toy_dataset) -> CorpusStore:
    return CorpusStore(toy_dataset.corpus_path, progress=False)


def test_minilm_recall_at_3_on_single_hop(minilm_encoder, minilm_index, corpus, single_hop):
    index = TorchFlatIndex.from_file(minilm_index["npy"], device=torch.device("cpu"))
    engine = RetrievalEngine(DenseSearch(minilm_encoder, index), corpus)
    assert recall_at_k(engine, single_hop, 3) >= 0.9


def test_bm25_refuses_a_folder_that_is_not_a_bm25s_index(tmp_path, corpus):
    folder = tmp_path / "bm25"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    with pytest.raises(IndexLoadError, match="not a bm25s index") as err:
        BM25Search(folder, corpus, progress=False)
    assert "leave out --index_path" in str(err.value)
    assert sorted(folder.iterdir()) == [folder / "notes.txt"]


def test_search_r1_bm25_command_on_a_lucene_index_serves_our_bm25s_index(tmp_path, corpus, single_hop, caplog):
    """Search-R1's BM25 launch points --index_path at the downloaded Pyserini (Lucene) index: the server starts with
    its own bm25s index built from the corpus, says so in one log line, and writes nothing into the Lucene folder."""
    lucene = tmp_path / "bm25"
    (lucene / "index").mkdir(parents=True)
    (lucene / "index" / "segments_1").write_text("x")
    before = sorted(lucene.rglob("*"))
    with caplog.at_level("WARNING", logger="local_dense_retriever.index.bm25"):
        backend = BM25Search(lucene, corpus, progress=False)
    assert [r for r in caplog.records if "Lucene (Pyserini) index" in r.getMessage()]
    assert sorted(lucene.rglob("*")) == before
    assert recall_at_k(RetrievalEngine(backend, corpus), single_hop, 3) >= 0.9


def test_bm25_recall_at_3_on_single_hop(toy_dataset, corpus, single_hop):
    engine = RetrievalEngine(BM25Search(bm25_dir_for(toy_dataset.corpus_path), corpus, progress=False), corpus)
    assert recall_at_k(engine, single_hop, 3) >= 0.9


def test_torch_and_faiss_backends_agree_on_the_minilm_index(minilm_encoder, minilm_index, toy_questions, corpus):
    queries = minilm_encoder.encode([q["question"] for q in toy_questions[:64]])
    t_scores, t_ids = TorchFlatIndex.from_file(minilm_index["faiss"], device=torch.device("cpu")).search(queries, 5)
    f_scores, f_ids = FaissIndex(minilm_index["faiss"]).search(queries, 5)
    np.testing.assert_array_equal(t_ids, f_ids)
    np.testing.assert_allclose(t_scores, f_scores, rtol=1e-5, atol=1e-5)
    npy = np.load(minilm_index["npy"])
    assert npy.shape == (len(corpus), 384)
    np.testing.assert_allclose(np.linalg.norm(npy, axis=1), 1.0, rtol=1e-4)


def test_bf16_encoder_retrieves_like_fp32(minilm_path, minilm_index, toy_questions):
    """The bf16 encoder (the default on AMX CPUs) ranks the toy corpus like the float32 one."""
    from local_dense_retriever.encoder import HFEncoder

    index = TorchFlatIndex.from_file(minilm_index["npy"], device=torch.device("cpu"))
    questions = [q["question"] for q in toy_questions]
    ranked = {}
    for dtype in ("float32", "bfloat16"):
        encoder = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype=dtype)
        ranked[dtype] = index.search(encoder.encode(questions), 3)[1]
    top1_same = (ranked["float32"][:, 0] == ranked["bfloat16"][:, 0]).mean()
    top3_overlap = np.mean(
        [len(set(a) & set(b)) / 3 for a, b in zip(ranked["float32"], ranked["bfloat16"], strict=True)]
    )
    assert top1_same >= 0.97 and top3_overlap >= 0.95, (top1_same, top3_overlap)
