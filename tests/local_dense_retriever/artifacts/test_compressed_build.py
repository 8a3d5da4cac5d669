"""build_index --index_type: compressed and approximate faiss indexes from flat vectors or a corpus, trained on a
sample, resumable, written atomically, with their recall against flat measured and stored beside them."""

from __future__ import annotations

import json
import logging

import faiss
import numpy as np
import pytest

from local_dense_retriever.artifacts import compressed_build
from local_dense_retriever.artifacts.build_index import main
from local_dense_retriever.artifacts.compressed_build import CompressedOptions, build_compressed_index
from local_dense_retriever.index.build_record import read_record, record_path
from local_dense_retriever.index.faiss_params import search_param

ROWS, DIM = 6000, 32


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    """Unit vectors around 60 centres, as a .npy and as a faiss IndexFlatIP file of the same rows."""
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((60, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 60, ROWS)] + 0.4 * rng.standard_normal((ROWS, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    folder = tmp_path_factory.mktemp("flat")
    np.save(folder / "flat.npy", x)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(x)
    faiss.write_index(flat, str(folder / "flat.index"))
    return folder


def _options(**kw) -> CompressedOptions:
    return CompressedOptions(**{"index_type": "ivf_sq8", "recall_sample": 200, "progress": False, **kw})


def test_ivf_sq8_from_a_npy_serves_every_row_and_records_its_recall(clustered, tmp_path):
    out = tmp_path / "ivf.index"
    record = build_compressed_index(clustered / "flat.npy", out, _options(target_recall=0.9))
    index = faiss.read_index(str(out))
    assert index.ntotal == ROWS and index.metric_type == faiss.METRIC_INNER_PRODUCT
    assert record.factory.endswith(",SQ8") and record.factory.startswith("IVF")
    assert record.rows == ROWS and record.dim == DIM and record.bytes == out.stat().st_size
    assert record.bytes < (clustered / "flat.npy").stat().st_size / 2  # 8 bits a value instead of 32, and its id
    # the stored nprobe is the file's own, the cheapest measured that reaches the target
    assert search_param(index) == ("nprobe", record.search_value)
    values = [p.value for p in record.curve]
    assert values == sorted(values) and values[-1] == faiss.extract_index_ivf(index).nlist
    assert record.recall_at(record.search_value, 3) >= 0.9
    assert all(p.recall["3"] < 0.9 for p in record.curve if p.value < record.search_value)
    assert record.recall_at(1, 3) < record.recall_at(values[-1], 3)  # one list of many misses neighbours
    assert record.recall_queries == 200 and "held-out passages" in record.query_source
    assert read_record(out) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ivf.index", "ivf.index.build.json"]


def test_a_faiss_flat_file_and_its_npy_build_the_same_index(clustered, tmp_path):
    a = build_compressed_index(clustered / "flat.npy", tmp_path / "a.index", _options())
    b = build_compressed_index(clustered / "flat.index", tmp_path / "b.index", _options())
    assert a.curve == b.curve  # same rows, same seeded samples
    queries = np.load(clustered / "flat.npy")[:20]
    ia, ib = faiss.read_index(str(tmp_path / "a.index")), faiss.read_index(str(tmp_path / "b.index"))
    np.testing.assert_array_equal(ia.search(queries, 5)[1], ib.search(queries, 5)[1])


@pytest.mark.parametrize(
    ("index_type", "param"), [("hnsw", "efSearch"), ("ivf_pq", "nprobe"), ("IVF16,Flat", "nprobe"), ("PCA16,SQ8", None)]
)
def test_each_type_builds_with_its_search_parameter(clustered, tmp_path, index_type, param):
    out = tmp_path / "x.index"
    record = build_compressed_index(clustered / "flat.npy", out, _options(index_type=index_type))
    index = faiss.read_index(str(out))
    assert index.ntotal == ROWS and search_param(index)[0] == record.search_param == param
    assert record.index_type == index_type
    if index_type == "IVF16,Flat":  # every list scanned: exactly flat's answers
        assert record.recall_at(16, 3) == 1.0
    if param is None:
        assert [p.value for p in record.curve] == [None] and record.search_value is None


def test_a_factory_string_faiss_refuses_is_a_clear_error_and_writes_nothing(clustered, tmp_path):
    with pytest.raises(ValueError, match="faiss cannot build index type 'IVF,Nonsense'"):
        build_compressed_index(clustered / "flat.npy", tmp_path / "x.index", _options(index_type="IVF,Nonsense"))
    assert list(tmp_path.iterdir()) == []


def test_a_build_killed_while_adding_resumes_from_its_checkpoint(clustered, tmp_path, monkeypatch, caplog):
    out = tmp_path / "ivf.index"
    options = _options(checkpoint_s=0, block_bytes=1000 * DIM * 4)  # blocks of 1000 rows, a checkpoint after each
    real_add, calls = compressed_build.add_block, []

    def dies_on_the_fourth(index, block):
        calls.append(len(block))
        if len(calls) == 4:
            raise RuntimeError("killed mid-build")
        real_add(index, block)

    monkeypatch.setattr(compressed_build, "add_block", dies_on_the_fourth)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_compressed_index(clustered / "flat.npy", out, options)
    assert not out.exists() and not record_path(out).exists()
    parts = tmp_path / "ivf.index.parts"
    assert json.loads((parts / "checkpoint.json").read_text()) == {"rows": 3000}

    trained = []
    monkeypatch.setattr(
        compressed_build, "add_block", lambda index, block: (calls.append(len(block)), real_add(index, block))
    )
    monkeypatch.setattr(compressed_build, "_train", lambda *a: trained.append(a))
    calls.clear()
    with caplog.at_level(logging.INFO, logger=compressed_build.__name__):
        record = build_compressed_index(clustered / "flat.npy", out, options)
    assert sum(calls) == ROWS - 3000 and trained == []  # only the rows not yet added; no training again
    assert "3000 rows already added" in caplog.text
    monkeypatch.undo()
    fresh = build_compressed_index(clustered / "flat.npy", tmp_path / "fresh.index", _options())
    assert record.curve == fresh.curve
    queries = np.load(clustered / "flat.npy")[:50]
    np.testing.assert_array_equal(
        faiss.read_index(str(out)).search(queries, 5)[1],
        faiss.read_index(str(tmp_path / "fresh.index")).search(queries, 5)[1],
    )
    assert not parts.exists()


def test_a_build_killed_after_training_does_not_train_again(clustered, tmp_path, monkeypatch):
    out = tmp_path / "ivf.index"
    monkeypatch.setattr(
        compressed_build, "add_block", lambda index, block: (_ for _ in ()).throw(RuntimeError("killed"))
    )
    with pytest.raises(RuntimeError, match="killed"):
        build_compressed_index(clustered / "flat.npy", out, _options())
    assert (tmp_path / "ivf.index.parts" / "trained.index").is_file()
    monkeypatch.undo()
    trained = []
    monkeypatch.setattr(compressed_build, "_train", lambda *a: trained.append(a))
    assert build_compressed_index(clustered / "flat.npy", out, _options()).rows == ROWS and trained == []


def test_parts_of_another_source_or_type_are_discarded(clustered, tmp_path, monkeypatch):
    out = tmp_path / "x.index"
    monkeypatch.setattr(
        compressed_build, "add_block", lambda index, block: (_ for _ in ()).throw(RuntimeError("killed"))
    )
    with pytest.raises(RuntimeError):
        build_compressed_index(clustered / "flat.npy", out, _options(index_type="IVF16,Flat"))
    monkeypatch.undo()
    record = build_compressed_index(clustered / "flat.npy", out, _options())  # another type: trains afresh
    assert record.factory.endswith("SQ8") and faiss.read_index(str(out)).ntotal == ROWS


def test_cli_from_a_flat_index_with_question_queries(minilm_index, minilm_path, toy_dataset, tmp_path, capsys):
    out = tmp_path / "toy_ivf.index"
    rc = main(["--from_index", str(minilm_index["faiss"]), "--index_type", "ivf_sq8", "--output", str(out),
               "--recall_queries", str(toy_dataset.qa_path), "--retriever_name", "minilm",
               "--retriever_model", str(minilm_path), "--device", "cpu", "--encoder_dtype", "float32"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    record = read_record(out)
    questions = len(toy_dataset.qa_path.read_text().splitlines())
    assert record.recall_queries == questions and record.query_source == f"questions of {toy_dataset.qa_path.name}"
    assert record.source == str(minilm_index["faiss"].resolve())
    assert (
        f"recall@3 {record.recall_at(record.search_value, 3)} at nprobe {record.search_value}"
        in capsys.readouterr().out
    )


def test_cli_encodes_a_corpus_into_flat_and_compressed_outputs(make_corpus, minilm_path, tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c.jsonl", [f"passage {i} about topic {i % 7}" for i in range(120)])
    flat, compressed = tmp_path / "flat.npy", tmp_path / "hnsw.index"
    rc = main(["--corpus_path", str(corpus), "--index_type", "hnsw", "--output", str(flat), "--output",
               str(compressed), "--retriever_name", "minilm", "--retriever_model", str(minilm_path),
               "--device", "cpu", "--recall_sample", "20"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert np.load(flat).shape == (120, 384) and faiss.read_index(str(compressed)).ntotal == 120
    assert read_record(compressed).source == str(flat.resolve())
    # without a flat output the vectors are encoded to a scratch file, removed once the build is done
    alone = tmp_path / "alone"
    alone.mkdir()
    rc = main(["--corpus_path", str(corpus), "--index_type", "IVF2,Flat", "--output", str(alone / "ivf.index"),
               "--retriever_name", "minilm", "--retriever_model", str(minilm_path), "--device", "cpu",
               "--recall_sample", "20"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in alone.iterdir()) == ["ivf.index", "ivf.index.build.json"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "x.index"], "give --corpus_path (encode a corpus) or --from_index"),
        (["--corpus_path", "c.jsonl", "--from_index", "f.npy", "--output", "x.index"], "not both"),
        (["--from_index", "f.npy", "--output", "x.index"], "give --index_type"),
        (["--from_index", "f.npy", "--index_type", "ivf_sq8", "--output", "x.npy"], "ending in .index or .faiss"),
        (
            ["--from_index", "f.npy", "--index_type", "hnsw", "--output", "x.index", "--target_recall", "1.5"],
            "must be in (0, 1]",
        ),
        (
            ["--from_index", "f.npy", "--index_type", "hnsw", "--output", "x.index", "--recall_sample", "0"],
            "must be at least 1",
        ),
    ],
)
def test_cli_refuses_bad_flag_combinations(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_bad_recall_queries_are_clear_errors_before_any_work(clustered, tmp_path, capsys):
    out = tmp_path / "x.index"
    base = ["--from_index", str(clustered / "flat.npy"), "--index_type", "IVF16,Flat", "--output", str(out)]
    assert main([*base, "--recall_queries", str(tmp_path / "missing.jsonl")]) == 1
    assert "missing.jsonl does not exist" in capsys.readouterr().err
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "fine"}\n{"answer": "no question"}\n')
    assert main([*base, "--recall_queries", str(bad)]) == 1
    assert "q.jsonl:2 has no string question, query, text field" in capsys.readouterr().err
    bad.write_text('{"question": "fine"}\n{not json\n')
    assert main([*base, "--recall_queries", str(bad)]) == 1
    assert "q.jsonl:2 is not JSON" in capsys.readouterr().err
    narrow = tmp_path / "q.npy"
    np.save(narrow, np.ones((5, DIM + 1), dtype=np.float32))
    assert main([*base, "--recall_queries", str(narrow)]) == 1
    assert f"the index is {DIM} wide" in capsys.readouterr().err
    assert not out.exists() and not record_path(out).exists()


def test_an_unreadable_record_is_ignored_with_a_warning(clustered, tmp_path, caplog):
    out = tmp_path / "x.index"
    build_compressed_index(clustered / "flat.npy", out, _options(index_type="IVF16,Flat"))
    record_path(out).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert read_record(out) is None
    assert "ignoring x.index.build.json" in caplog.text
    assert read_record(tmp_path / "none.index") is None


def test_a_pca_keeps_the_inner_product_ranking_of_vectors_that_share_a_mean(tmp_path):
    # Like sentence-encoder vectors: one direction common to all, the differences in a few others. Centred, a PCA
    # would rank rows partly by their own offset; the build keeps its map linear, so ranking is kept.
    rng = np.random.default_rng(3)
    common = np.zeros(DIM, dtype=np.float32)
    common[0] = 1.0
    spread = np.zeros((ROWS, DIM), dtype=np.float32)
    spread[:, 1:13] = 0.5 * rng.standard_normal((ROWS, 12))
    spread[:, 13:] = 0.002 * rng.standard_normal((ROWS, DIM - 13))
    x = common + spread
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "flat.npy", x)
    record = build_compressed_index(tmp_path / "flat.npy", tmp_path / "pca.index", _options(index_type="PCA16,Flat"))
    assert record.recall_at(None, 3) >= 0.98
    loaded = faiss.read_index(str(tmp_path / "pca.index"))  # kept alive: the views below point into it
    pca = faiss.downcast_VectorTransform(faiss.downcast_index(loaded).chain.at(0))
    assert not faiss.vector_to_array(pca.b).any()
