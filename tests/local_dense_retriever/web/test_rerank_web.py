"""The rerank stage over the web backend: the provider's hits come back in the cross-encoder's order, and in replay a
query that was never recorded fails its own request (not_cached) while a recorded query sent meanwhile by another
request is answered reranked (each request is served on its own: the web backend has no micro-batches)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from local_dense_retriever.web.errors import NotCached

CANDIDATES = 8
RECORDED = "marie curie"


def ask(url: str, queries: list[str]) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}, timeout=60)


def test_web_hits_are_reranked_and_a_replay_miss_spares_its_batch_mate(
    provider, web_server, make_cross_encoder, tmp_path, monkeypatch
):
    make_cross_encoder(tmp_path / "cross_encoder")
    rerank = {"reranker_model": str(tmp_path / "cross_encoder"), "rerank_candidates": CANDIDATES, "device": "cpu",
              "rerank_max_length": 64, "max_wait_ms": 0}  # fmt: skip
    url, engine = web_server(**rerank)
    answer = ask(url, [RECORDED])
    assert answer.status_code == 200
    hits = answer.json()["result"][0]
    assert provider.requests[-1]["json"]["num"] == CANDIDATES  # the stage asks the provider for its candidates
    candidates = [doc for doc, _ in engine.backend.search([RECORDED], CANDIDATES)[0]]  # the provider's order
    with torch.inference_mode():
        scores = engine.reranker.score([(RECORDED, doc["contents"]) for doc in candidates])
    best = sorted(zip(candidates, scores, strict=True), key=lambda pair: -pair[1])[:3]
    assert [h["document"]["id"] for h in hits] == [doc["id"] for doc, _ in best]
    assert [h["score"] for h in hits] == pytest.approx([s for _, s in best], abs=1e-4)
    assert [h["document"]["id"] for h in hits] != [doc["id"] for doc in candidates[:3]], "the scorer kept the order"

    monkeypatch.delenv("SERPER_API_KEY")
    provider.requests.clear()
    replay_url, replay = web_server(web_cache_mode="replay", **rerank)
    failed = replay.search([RECORDED, "never recorded"], 3)  # one engine batch: the failed slot passes through
    assert [d["id"] for d, _ in failed[0]] == [h["document"]["id"] for h in hits] and isinstance(failed[1], NotCached)

    rows: list[int] = []
    gate = threading.Event()

    def hold_first_batch(module, args, kwargs):
        rows.append(int(kwargs["input_ids"].shape[0]))
        if len(rows) == 1:
            gate.wait(30)  # the next two requests arrive meanwhile

    handle = replay.reranker.score.model.register_forward_pre_hook(hold_first_batch, with_kwargs=True)
    answers: dict[str, httpx.Response] = {}
    try:
        first = threading.Thread(target=lambda: answers.setdefault("first", ask(replay_url, [RECORDED])))
        first.start()
        deadline = time.monotonic() + 30
        while not rows and time.monotonic() < deadline:
            time.sleep(0.01)
        later = [threading.Thread(target=lambda n=n, q=q: answers.setdefault(n, ask(replay_url, [q])))
                 for n, q in (("recorded", RECORDED), ("missing", "never recorded"))]  # fmt: skip
        for thread in later:
            thread.start()
        while httpx.get(f"{replay_url}/metrics").json()["queue_depth"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        for thread in [first, *later]:
            thread.join(60)
    finally:
        handle.remove()
        gate.set()
    assert answers["missing"].status_code == 503 and answers["missing"].json()["error"] == "not_cached"
    assert answers["recorded"].status_code == 200 and answers["recorded"].json()["result"][0] == hits
    assert answers["first"].json()["result"][0] == hits
    assert rows == [CANDIDATES, CANDIDATES]  # the recorded query's pairs only: the miss never reached the reranker
    metrics = httpx.get(f"{replay_url}/metrics").json()
    assert metrics["batches_total"] == 3 and metrics["errors_by_kind"] == {"not_cached": 1}
    assert provider.requests == []
