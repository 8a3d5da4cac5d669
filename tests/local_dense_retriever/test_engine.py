"""load_engine: each backend is assembled from a ServerConfig and answers with corpus documents, best first."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import load_engine
from local_dense_retriever.errors import IndexLoadError


@pytest.mark.parametrize(("index", "backend"), [("npy", "torch"), ("faiss", "torch"), ("faiss", "faiss")])
def test_dense_backends_serve_the_same_top_hit(minilm_index, toy_dataset, minilm_path, toy_questions, index, backend):
    config = ServerConfig(index_path=minilm_index[index], corpus_path=toy_dataset.corpus_path, backend=backend,
                          retriever_name="minilm", retriever_model=str(minilm_path), device="cpu")  # fmt: skip
    engine = load_engine(config, progress=False)
    q = next(q for q in toy_questions if q["metadata"]["hops"] == 1)
    hits = engine.search([q["question"]], 3)[0]
    assert hits[0][0]["id"] in q["metadata"]["supporting_ids"]
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert set(engine.load_seconds) == {"corpus", "encoder", f"{backend} index", "page urls"}


def test_identical_queries_are_encoded_once_and_each_gets_the_answer(
    minilm_index, toy_dataset, minilm_path, toy_questions
):
    """A GRPO group's samples can search the same text at once: one encoding and one scan serve them all."""
    config = ServerConfig(index_path=minilm_index["npy"], corpus_path=toy_dataset.corpus_path, retriever_name="minilm",
                          retriever_model=str(minilm_path), device="cpu")  # fmt: skip
    engine = load_engine(config, progress=False)
    a, b = (q["question"] for q in toy_questions[:2])
    alone = engine.search([a, b], 3)
    encoder, seen = engine.backend.encoder, []
    encode = encoder.encode
    encoder.encode = lambda texts, **kw: seen.append(list(texts)) or encode(texts, **kw)
    answers = engine.search([a, b, a, a], 3)
    assert seen == [[a, b]] and engine.meter.duplicate_queries == 2
    assert answers == [alone[0], alone[1], alone[0], alone[0]]
    assert [d["id"] for d, _ in engine.search([b], 3)[0]] == [d["id"] for d, _ in alone[1]]
    assert engine.meter.duplicate_queries == 2  # nothing repeated there


def test_bm25_needs_only_the_corpus(animal_corpus):
    engine = load_engine(ServerConfig(corpus_path=animal_corpus, retriever_name="bm25"), progress=False)
    assert engine.search(["item23"], 1)[0][0][0]["id"] == "23"
    assert "bm25" in engine.describe()


def test_index_wider_than_the_encoder_is_refused(tmp_path, toy_dataset, minilm_path):
    import numpy as np

    np.save(tmp_path / "wide.npy", np.zeros((10, 768), dtype=np.float32))
    config = ServerConfig(index_path=tmp_path / "wide.npy", corpus_path=toy_dataset.corpus_path,
                          retriever_name="minilm", retriever_model=str(minilm_path), device="cpu")  # fmt: skip
    with pytest.raises(IndexLoadError, match="encoder width 384 does not match index width 768"):
        load_engine(config, progress=False)


def test_index_larger_than_the_corpus_is_refused(tmp_path, animal_corpus, minilm_path):
    import numpy as np

    np.save(tmp_path / "big.npy", np.zeros((51, 384), dtype=np.float32))
    config = ServerConfig(index_path=tmp_path / "big.npy", corpus_path=animal_corpus, retriever_name="minilm",
                          retriever_model=str(minilm_path), device="cpu")  # fmt: skip
    with pytest.raises(IndexLoadError, match="51 passages but the corpus only 50 rows"):
        load_engine(config, progress=False)


def test_config_rejects_unknown_keys_and_inconsistent_limits():
    with pytest.raises(ValidationError, match="retreiver_name"):
        ServerConfig(retreiver_name="e5")
    with pytest.raises(ValidationError, match="a full request could never be queued"):
        ServerConfig(max_queue=8, max_queries_per_request=64)


def test_a_small_score_buffer_steps_the_scan_and_keeps_answers(minilm_index, toy_dataset, minilm_path, toy_questions):
    """--score_buffer_mb bounds the memory of one search step, never the answer."""
    from local_dense_retriever.retrieval_server import config_from_args

    common = ["--index_path", str(minilm_index["npy"]), "--corpus_path", str(toy_dataset.corpus_path),
              "--retriever_name", "minilm", "--retriever_model", str(minilm_path), "--device", "cpu"]  # fmt: skip
    config, _ = config_from_args([*common, "--score_buffer_mb", "1"])
    small, default = load_engine(config, progress=False), load_engine(config_from_args(common)[0], progress=False)
    questions = [q["question"] for q in toy_questions] * 70  # 2,100: 1 MiB holds their scores over 124 rows
    index = small.backend.index
    assert index.scan.rows_per_step(len(questions)) < len(index) // 2
    assert small.search(questions, 5) == default.search(questions, 5)
