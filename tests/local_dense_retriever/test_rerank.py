"""The rerank stage: a cross-encoder loaded through the server's flags rescores each query's candidates, scoring a
micro-batch's pairs together, and a scorer that knows the answer lifts the gold passage to rank 1 on the toy world."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine, load_engine
from local_dense_retriever.errors import RerankerError
from local_dense_retriever.rerank import Reranker, load_reranker
from local_dense_retriever.retrieval_server import config_from_args
from local_dense_retriever.toy.embedded_default import prepare_embedded_default

CANDIDATES = 8
QUERIES = ["who founded the city of Gozairrul", "which medal did the architect receive", "canal building studies"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, make_cross_encoder):
    folder = tmp_path_factory.mktemp("cross_encoder")
    make_cross_encoder(folder)
    return folder


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def engine(cross_encoder, cache_dir) -> RetrievalEngine:
    """The embedded default with the rerank stage, configured by the server's own command line."""
    config, _ = config_from_args(["--cache_dir", str(cache_dir), "--device", "cpu", "--topk", "3",
                                  "--reranker_model", str(cross_encoder), "--rerank_candidates", str(CANDIDATES),
                                  "--rerank_batch_size", "64", "--rerank_max_length", "128"])  # fmt: skip
    return load_engine(config, progress=False)


def model_scores(engine: RetrievalEngine, query: str, docs: list[dict]) -> list[float]:
    """The cross-encoder's score of each (query, passage) pair, one pair per forward pass."""
    scorer = engine.reranker.score
    out = []
    with torch.inference_mode():
        for doc in docs:
            batch = scorer.tokenizer([query], [doc["contents"]], truncation=True, max_length=128, return_tensors="pt")
            out.append(float(scorer.model(**batch).logits[0, 0]))
    return out


def test_answers_are_the_candidates_in_the_order_of_the_models_scores(engine):
    reranked = engine.search(QUERIES, 3)
    dense = RetrievalEngine(engine.backend, engine.corpus).search(QUERIES, CANDIDATES)
    assert [len(hits) for hits in reranked] == [3, 3, 3]
    moved = 0
    for query, hits, candidates in zip(QUERIES, reranked, dense, strict=True):
        scores = model_scores(engine, query, [doc for doc, _ in candidates])
        best = sorted(zip(candidates, scores, strict=True), key=lambda pair: -pair[1])[:3]
        assert [doc["id"] for doc, _ in hits] == [doc["id"] for (doc, _), _ in best]
        assert [s for _, s in hits] == pytest.approx([s for _, s in best], abs=1e-4)  # the rerank score is the score
        moved += [doc["id"] for doc, _ in hits] != [doc["id"] for doc, _ in candidates[:3]]
    assert moved, "the stage changed no order: the test would not notice a missing stage"
    assert len(engine.search(QUERIES[:1], 12)[0]) == 12  # a topk above the candidates rescores that many
    assert "rerank cross_encoder" in engine.describe() and "8 candidates" in engine.describe()


def test_two_concurrent_requests_are_scored_in_one_forward_batch(engine):
    model = engine.reranker.score.model
    rows: list[int] = []
    gate = threading.Event()

    def hook(module, args, kwargs):
        rows.append(int(kwargs["input_ids"].shape[0]))
        if len(rows) == 1:
            gate.wait(30)  # hold the first micro-batch so the next two requests queue together

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    config = ServerConfig(max_wait_ms=0)
    try:
        with BackgroundServer(create_app(config, engine=engine)) as server:
            url = f"{server.url}/retrieve"
            answers = {}

            def ask(name: str, queries: list[str]) -> None:
                answers[name] = httpx.post(url, json={"queries": queries, "topk": 3, "return_scores": True}, timeout=60)

            first = threading.Thread(target=ask, args=("first", QUERIES[:1]))
            first.start()
            deadline = time.monotonic() + 30
            while not rows and time.monotonic() < deadline:
                time.sleep(0.01)
            later = [threading.Thread(target=ask, args=(n, [q])) for n, q in (("a", QUERIES[1]), ("b", QUERIES[2]))]
            for t in later:
                t.start()
            while httpx.get(f"{server.url}/metrics").json()["queue_depth"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            gate.set()
            for t in [first, *later]:
                t.join(60)
            metrics = httpx.get(f"{server.url}/metrics").json()
    finally:
        handle.remove()
        gate.set()
    assert all(answers[n].status_code == 200 for n in ("first", "a", "b"))
    assert rows == [CANDIDATES, 2 * CANDIDATES]  # the two later requests' 16 pairs in one forward pass
    assert [h["document"]["id"] for h in answers["a"].json()["result"][0]] == [
        d["id"] for d, _ in engine.search(QUERIES[1:2], 3)[0]
    ]
    assert metrics["cpu_seconds"]["rerank"] > 0 and metrics["cpu_seconds"]["wall"]["rerank"] > 0


def test_pairs_are_scored_in_chunks_of_the_batch_size(engine):
    scorer = engine.reranker.score
    rows: list[int] = []
    handle = scorer.model.register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    old, scorer.batch_size = scorer.batch_size, 5
    try:
        chunked = engine.search(QUERIES[:2], 3)
    finally:
        scorer.batch_size = old
        handle.remove()
    assert rows == [5, 5, 5, 1]  # 16 pairs
    assert [[d["id"] for d, _ in hits] for hits in chunked] == [
        [d["id"] for d, _ in hits] for hits in engine.search(QUERIES[:2], 3)
    ]


def test_the_stage_lifts_the_gold_passage_to_rank_1_on_the_toy_world(engine, cache_dir):
    """A scorer that knows each question's gold passage (its first supporting passage, the one the question names),
    put at the stage's seam, moves it to the top wherever the dense retriever ranked it lower among the candidates."""
    paths = prepare_embedded_default(ServerConfig(cache_dir=cache_dir), progress=False)
    questions = [json.loads(line) for line in paths.qa_path.read_text().splitlines()]
    gold = {q["question"]: str(q["metadata"]["supporting_ids"][0]) for q in questions}
    dense = RetrievalEngine(engine.backend, engine.corpus)
    texts = list(gold)
    ranks = [[d["id"] for d, _ in hits].index(gold[q]) if gold[q] in [d["id"] for d, _ in hits] else None
             for q, hits in zip(texts, dense.search(texts, CANDIDATES), strict=True)]  # fmt: skip
    lower = [q for q, rank in zip(texts, ranks, strict=True) if rank is not None and rank > 0]
    assert len(lower) >= 5, "the dense retriever ranks every answer first: nothing to show"
    calls = []

    def knows_the_answer(pairs: list[tuple[str, str]]) -> list[float]:
        calls.append(len(pairs))
        contents = {q: engine.corpus.get(int(gold[q]))["contents"] for q, _ in pairs}
        return [1.0 if passage == contents[q] else 0.0 for q, passage in pairs]

    oracle = RetrievalEngine(engine.backend, engine.corpus, reranker=Reranker(knows_the_answer, CANDIDATES))
    answered = oracle.search(lower, 3)
    assert [hits[0][0]["id"] for hits in answered] == [gold[q] for q in lower]
    assert [hits[0][1] for hits in answered] == [1.0] * len(lower)
    assert calls == [len(lower) * CANDIDATES]  # every pair of the batch in one call


def test_the_server_flags_check_the_candidates_against_topk(cross_encoder):
    with pytest.raises(ValueError, match="rerank_candidates=2 is below topk=3"):
        config_from_args(["--reranker_model", str(cross_encoder), "--rerank_candidates", "2", "--topk", "3"])


def test_a_missing_reranker_folder_stops_the_start_up_with_a_clear_error(tmp_path, cache_dir):
    config, _ = config_from_args(["--cache_dir", str(cache_dir), "--device", "cpu",
                                  "--reranker_model", str(tmp_path / "no-such-reranker")])  # fmt: skip
    with pytest.raises(RerankerError, match="reranker folder not found: .*no-such-reranker"):
        load_engine(config, progress=False)


@pytest.mark.parametrize("kind", ["encoder without a head", "three labels", "empty folder"])
def test_a_folder_that_is_not_a_cross_encoder_is_refused(tmp_path, minilm_path, make_cross_encoder, kind):
    folder = tmp_path / "reranker"
    expected = {"encoder without a head": "no trained classification head .*classifier.weight",
                "three labels": "3 output labels", "empty folder": "cannot load reranker"}[kind]  # fmt: skip
    if kind == "encoder without a head":
        folder = minilm_path
    elif kind == "three labels":
        make_cross_encoder(folder, num_labels=3)
    else:
        folder.mkdir()
    with pytest.raises(RerankerError, match=expected):
        load_reranker(ServerConfig(reranker_model=str(folder), device="cpu"))


def test_a_two_label_model_scores_with_its_positive_class(tmp_path, make_cross_encoder):
    from local_dense_retriever.rerank import CrossEncoder

    make_cross_encoder(tmp_path, num_labels=2)
    scorer = CrossEncoder(tmp_path, device="cpu")
    pairs = [("a question", "a passage"), ("another question", "some other passage text")]
    with torch.inference_mode():
        logits = scorer.model(**scorer.tokenizer(["a question"], ["a passage"], return_tensors="pt")).logits
    assert scorer(pairs)[0] == pytest.approx(float(logits[0, 1]), abs=1e-5)
