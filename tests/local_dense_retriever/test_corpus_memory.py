"""A 1M-line corpus served through the real HTTP server: memory stays flat however many rows are read."""

from __future__ import annotations

import json
import random

import httpx
import numpy as np
import psutil
import pytest
import torch

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.index.base import DenseSearch
from local_dense_retriever.index.torch_flat import TorchFlatIndex

ROWS = 1_000_000


class RandomEncoder:
    """Queries land anywhere in the index, so hits are spread over the whole corpus file."""

    dim = 8
    device = torch.device("cpu")

    def encode(self, texts, *, is_query=True):
        gen = torch.Generator().manual_seed(hash(tuple(texts)) % 2**31)
        return torch.nn.functional.normalize(torch.randn(len(texts), self.dim, generator=gen), dim=-1)


@pytest.mark.slow
def test_serving_a_million_line_corpus_keeps_rss_flat(tmp_path):
    path = tmp_path / "big.jsonl"
    filler = "lorem ipsum dolor sit amet " * 20
    with open(path, "w") as f:
        for i in range(ROWS):
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\n{i} {filler}'}) + "\n")
    vectors = np.random.default_rng(0).standard_normal((ROWS, 8), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    corpus = CorpusStore(path, progress=False)
    engine = RetrievalEngine(DenseSearch(RandomEncoder(), TorchFlatIndex(vectors, device=torch.device("cpu"))), corpus)
    proc = psutil.Process()
    with BackgroundServer(create_app(ServerConfig(max_topk=20), engine=engine)) as srv, httpx.Client() as client:
        client.post(f"{srv.url}/retrieve", json={"queries": ["warm up"], "topk": 20})
        baseline = proc.memory_info().rss
        seen: set[str] = set()
        for n in range(1500):
            queries = [f"q{n}-{j}-{random.random()}" for j in range(8)]
            result = client.post(f"{srv.url}/retrieve", json={"queries": queries, "topk": 20}).json()["result"]
            for hits in result:
                for doc in hits:
                    assert doc["contents"].startswith(f'"Title {doc["id"]}"')
                    seen.add(doc["id"])
        grown = proc.memory_info().rss - baseline
    print(f"{len(seen)} distinct rows served; RSS grew {grown / 2**20:.1f} MB")
    assert len(seen) > 50_000  # a large share of the corpus was actually read
    assert grown < 150 * 2**20, f"RSS grew by {grown / 2**20:.0f} MB"
