"""--nprobe / --ef_search on real faiss indexes, and what a served index says of itself (type, search-time parameter,
stored recall, memory) in describe(), the ``index:`` line and /health ``index``, with and without a build record."""

from __future__ import annotations

from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
import torch

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.base import DenseSearch
from local_dense_retriever.index.build_record import BuildRecord, RecallPoint, write_record
from local_dense_retriever.index.faiss_index import FaissIndex
from local_dense_retriever.index.faiss_params import search_param

ROWS, DIM, NLIST = 2_000, 32, 16


def clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows around NLIST centres with noise as wide as the centres' spread: neighbours often sit in another list."""
    centres = rng.standard_normal((NLIST, DIM)).astype(np.float32)
    x = centres[rng.integers(NLIST, size=n)] + rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return clustered(np.random.default_rng(0), ROWS)


def build(folder: Path, factory: str, vectors: np.ndarray, name: str | None = None) -> Path:
    index = faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    if factory.startswith("IDMap"):
        index.add_with_ids(vectors, np.arange(len(vectors)))
    else:
        index.add(vectors)
    path = folder / (name or f"{factory.replace(',', '_')}.index")
    faiss.write_index(index, str(path))
    return path


def record(path: Path, factory: str, param: str | None, value: int | None, curve: dict, **kw) -> None:
    """The build record build_index.py would write beside ``path`` (``curve``: value -> {k: recall})."""
    fields = {"index_type": factory.lower().replace(",", "_"), "factory": factory, "rows": ROWS, "dim": DIM,
              "bytes": path.stat().st_size, "source": "flat.index", "train_rows": ROWS, "search_param": param,
              "search_value": value, "recall_queries": 200, "query_source": "held-out rows", **kw}  # fmt: skip
    points = [RecallPoint(v, {str(k): r for k, r in recall.items()}) for v, recall in curve.items()]
    write_record(path, BuildRecord(**fields, curve=points))


@pytest.fixture(scope="module")
def ivf(tmp_path_factory, vectors) -> Path:
    return build(tmp_path_factory.mktemp("ivf"), f"IVF{NLIST},SQ8", vectors)


@pytest.fixture(scope="module")
def hnsw(tmp_path_factory, vectors) -> Path:
    return build(tmp_path_factory.mktemp("hnsw"), "HNSW16", vectors)


def recall_at_10(index: FaissIndex, vectors: np.ndarray, queries: np.ndarray) -> float:
    truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    _, ids = index.search(torch.from_numpy(queries), 10)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, ids, strict=True)]))


def test_nprobe_changes_what_an_ivf_index_finds(ivf, vectors):
    queries = clustered(np.random.default_rng(1), 100)
    one, every = FaissIndex(ivf, nprobe=1), FaissIndex(ivf, nprobe=NLIST)
    assert (one.info.search_param, one.info.search_value) == ("nprobe", 1)
    assert search_param(every._index) == ("nprobe", NLIST)  # read back from the index itself
    low, high = recall_at_10(one, vectors, queries), recall_at_10(every, vectors, queries)
    assert high > 0.9 and high - low > 0.2, (low, high)
    assert FaissIndex(ivf).info.search_value == 1  # none given: faiss's stored default


def test_ef_search_is_set_through_an_idmap_wrapper(tmp_path, vectors):
    path = build(tmp_path, "IDMap,HNSW16", vectors, "idmap.index")
    index = FaissIndex(path, ef_search=77)
    assert (index.info.search_param, index.info.search_value) == ("efSearch", 77)
    assert "IndexIDMap (efSearch 77, no build record)" in index.describe()


@pytest.mark.parametrize(
    ("which", "knobs", "message"),
    [
        ("ivf", {"ef_search": 64}, r"--ef_search 64: .*IndexIVFScalarQuantizer, which has no efSearch \(it is "
         r"searched with --nprobe\); --ef_search applies to HNSW indexes"),
        ("hnsw", {"nprobe": 8}, r"--nprobe 8: .*IndexHNSWFlat, which has no nprobe \(it is searched with "
         r"--ef_search\); --nprobe applies to IVF indexes"),
        ("flat", {"nprobe": 8}, r"IndexFlatIP, which has no nprobe \(it has no search-time parameter\)"),
        ("flat", {"ef_search": 8}, r"IndexFlatIP, which has no efSearch"),
    ],
)  # fmt: skip
def test_a_knob_the_index_lacks_is_a_load_error(ivf, hnsw, tmp_path, vectors, which, knobs, message):
    paths = {"ivf": ivf, "hnsw": hnsw, "flat": tmp_path / "flat.index"}
    if which == "flat":
        flat = faiss.IndexFlatIP(DIM)
        flat.add(vectors)
        faiss.write_index(flat, str(paths["flat"]))
    with pytest.raises(IndexLoadError, match=message):
        FaissIndex(paths[which], **knobs)


def test_describe_and_info_with_a_build_record(tmp_path, vectors):
    path = build(tmp_path, f"IVF{NLIST},SQ8", vectors, "ivf_sq8.index")
    record(path, f"IVF{NLIST},SQ8", "nprobe", 4, {1: {1: 0.81, 10: 0.7}, 4: {1: 0.97, 3: 0.987, 10: 0.95}})
    index = FaissIndex(path, nprobe=4, recall_k=3)
    size = path.stat().st_size
    assert index.describe().startswith(f"faiss IVF{NLIST},SQ8 (nprobe 4, recall@3 0.987 vs flat), 2,000 x 32 on cpu")
    assert index.info.to_dict() == {
        "type": "ivf16_sq8", "factory": f"IVF{NLIST},SQ8", "search_param": "nprobe", "search_value": 4,
        "recall": {"1": 0.97, "3": 0.987, "10": 0.95},
        "recall_note": "recall@3 0.987 vs flat at nprobe=4 (200 queries from held-out rows)", "bytes": size,
    }  # fmt: skip
    assert index.index_info(5).recall_k == 3 and index.index_info(8).recall_k == 10  # the nearest k measured
    line = index.info.log_line()
    assert line.startswith(f"index: ivf16_sq8, factory IVF{NLIST},SQ8, nprobe 4; recall@3 0.987 vs flat")
    assert line.endswith("(the file's size, what a CPU faiss index holds)")
    other = FaissIndex(path, nprobe=2).info  # a value the build did not measure
    assert other.recall is None and other.recall_note == "recall not measured at nprobe=2 (measured at nprobe=1, 4)"
    assert "(nprobe 2, recall not measured at nprobe=2" in FaissIndex(path, nprobe=2).describe()


def test_a_record_of_another_index_is_ignored(tmp_path, vectors, caplog):
    path = build(tmp_path, f"IVF{NLIST},SQ8", vectors, "ivf.index")
    record(path, f"IVF{NLIST},SQ8", "nprobe", 1, {1: {3: 0.9}}, rows=ROWS + 1)
    info = FaissIndex(path).info
    assert info.type == "IndexIVFScalarQuantizer" and info.recall_note == "no build record"
    assert "ignoring ivf.index.build.json: it describes 2001 x 32 rows" in caplog.text


class VectorEncoder:
    """Query i of the test encodes to row i of ``queries`` (queries are the texts "0", "1", ...)."""

    device = torch.device("cpu")

    def __init__(self, queries: np.ndarray) -> None:
        self.queries, self.dim = queries, queries.shape[1]

    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor:
        return torch.from_numpy(self.queries[[int(t) for t in texts]])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, make_corpus) -> CorpusStore:
    path = make_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", [f"passage {i}" for i in range(ROWS)])
    return CorpusStore(path, progress=False)


def test_health_shows_the_served_index_and_its_nprobe(ivf, vectors, corpus):
    """/health ``index`` says what is served at the value --nprobe set; its other keys are as before."""
    config = ServerConfig(topk=3)
    queries = clustered(np.random.default_rng(2), 4)
    engine = RetrievalEngine(DenseSearch(VectorEncoder(queries), FaissIndex(ivf, nprobe=6)), corpus)
    with BackgroundServer(create_app(config, engine=engine)) as srv:
        body = httpx.get(f"{srv.url}/health").json()
        hits = httpx.post(f"{srv.url}/retrieve", json={"queries": ["0"], "topk": 3}).json()["result"][0]
    assert {"status", "detail", "passages", "batching", "pages", "gpus"} < set(body)
    assert body["index"] == {"type": "IndexIVFScalarQuantizer", "factory": None, "search_param": "nprobe",
                             "search_value": 6, "recall": None, "recall_note": "no build record",
                             "bytes": ivf.stat().st_size}  # fmt: skip
    assert "faiss IndexIVFScalarQuantizer (nprobe 6, no build record), 2,000 x 32 on cpu" in body["detail"]
    assert len(hits) == 3


def test_health_index_of_the_torch_flat_backend_and_of_bm25(make_hash_engine, animal_corpus):
    engine = make_hash_engine(animal_corpus)
    assert engine.index_report(3) == {"type": "flat", "factory": None, "search_param": None, "search_value": None,
                                      "recall": {"3": 1.0}, "recall_note": "exact: every row scored (float32)",
                                      "bytes": 50 * 16384 * 4}  # fmt: skip
    from local_dense_retriever.engine import load_engine

    bm25 = load_engine(ServerConfig(corpus_path=animal_corpus, retriever_name="bm25"), progress=False)
    assert bm25.index_report(3) is None
