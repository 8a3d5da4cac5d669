"""search_r1_agent against our own retrieval service (local_dense_retriever, BM25 backend) on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
import yaml
from verl.utils.reward_score import default_compute_score

from cpu_bench.background_server import BackgroundServer
from cpu_bench.testing.scripted_policy import native_search_policy
from cpu_bench.testing.scripted_rollout import run_rows

PASSAGES = [
    '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.',
    '"Paris"\nParis is the capital and largest city of France.',
    '"Danube"\nThe Danube flows through Vienna, Budapest and Belgrade.',
    '"Macbeth"\nMacbeth is a tragedy about a Scottish general.',
]


@pytest.fixture(scope="module")
def local_retriever(tmp_path_factory):
    from local_dense_retriever.app import create_app
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.corpus_store import CorpusStore
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.index.bm25 import BM25Search

    root = tmp_path_factory.mktemp("bm25")
    corpus_path = root / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n" for i, t in enumerate(PASSAGES)))
    corpus = CorpusStore(corpus_path, progress=False)
    engine = RetrievalEngine(BM25Search(root / "index", corpus, progress=False), corpus)
    with BackgroundServer(create_app(ServerConfig(), engine=engine)) as server:
        yield f"{server.url}/retrieve"


async def test_search_r1_agent_answers_from_the_local_retriever(
    local_retriever, tool_yaml, tokenizer_dir, rows, oracle
):
    config = yaml.safe_load(tool_yaml.read_text())
    config["tools"][0]["config"]["retrieval_service_url"] = local_retriever
    tool_yaml.write_text(yaml.safe_dump(config))
    result = await run_rows(
        [rows("who wrote hamlet?", "search_r1_agent")],
        policy=native_search_policy(oracle),
        tool_config_path=tool_yaml,
        tokenizer_dir=tokenizer_dir,
        compute_score=default_compute_score,
    )
    trajectory = result.trajectories[0]
    assert '<information>Doc 1(Title: "Hamlet") Hamlet is a tragedy written by William Shakespeare' in (
        trajectory.response_text
    )
    assert trajectory.extra_fields["search_failures"] == 0
    assert trajectory.score == 1.0
