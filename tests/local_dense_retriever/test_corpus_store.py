"""CorpusStore: random access by row through a saved offsets table that is rebuilt when the corpus changes."""

from __future__ import annotations

import gzip
import json
import os
from contextlib import closing

import pytest

from local_dense_retriever.corpus_store import CorpusError, CorpusStore, offsets_path_for


def test_random_access_returns_each_row(tmp_path, make_corpus):
    path = make_corpus(tmp_path / "c.jsonl", [f"text {i} ünïcode" for i in range(100)])
    with closing(CorpusStore(path, progress=False)) as store:
        assert len(store) == 100
        for row in (99, 0, 57, 1):
            assert store.get(row) == {"id": str(row), "contents": f'"Doc {row}"\ntext {row} ünïcode'}
        with pytest.raises(IndexError, match="out of range"):
            store.get(100)


def test_offsets_table_is_saved_and_reused(tmp_path, make_corpus):
    path = make_corpus(tmp_path / "c.jsonl", ["a", "b", "c"])
    CorpusStore(path, progress=False).close()
    table = offsets_path_for(path)
    assert table.is_file()
    stamp = table.stat().st_mtime_ns
    with closing(CorpusStore(path, progress=False)) as store:
        assert store.get(2)["contents"].endswith("c")
    assert table.stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_changed_corpus_rebuilds_the_table(tmp_path, make_corpus):
    path = make_corpus(tmp_path / "c.jsonl", ["a", "b"])
    CorpusStore(path, progress=False).close()
    make_corpus(path, ["first", "second", "third"])
    with closing(CorpusStore(path, progress=False)) as store:
        assert len(store) == 3
        assert store.get(2)["contents"].endswith("third")


def test_corrupt_table_is_rebuilt(tmp_path, make_corpus):
    path = make_corpus(tmp_path / "c.jsonl", ["a", "b"])
    offsets_path_for(path).write_bytes(b"garbage")
    with closing(CorpusStore(path, progress=False)) as store:
        assert store.get(1)["contents"].endswith("b")


def test_last_line_without_newline_and_trailing_blank_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "x"}\n{"id": "1", "contents": "y"}')
    with closing(CorpusStore(path, progress=False)) as store:
        assert len(store) == 2 and store.get(1)["contents"] == "y"
    path.write_text('{"id": "0", "contents": "x"}\n\n\n')
    with closing(CorpusStore(path, progress=False)) as store:
        assert len(store) == 1


def test_missing_id_defaults_to_row_and_extra_keys_pass_through(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"contents": "x", "title": "T"}) + "\n")
    with closing(CorpusStore(path, progress=False)) as store:
        assert store.get(0) == {"contents": "x", "title": "T", "id": "0"}


def test_gzip_corpus_is_refused_with_a_hint(tmp_path):
    path = tmp_path / "wiki-18.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"id": "0", "contents": "x"}\n')
    with pytest.raises(CorpusError, match="gunzip"):
        CorpusStore(path)


def test_missing_corpus(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        CorpusStore(tmp_path / "nope.jsonl")


def test_malformed_row_names_the_row(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "x"}\nnot json\n{"id": "2"}\n')
    with closing(CorpusStore(path, progress=False)) as store:
        with pytest.raises(CorpusError, match="row 1 is not JSON"):
            store.get(1)
        with pytest.raises(CorpusError, match="row 2 has no 'contents'"):
            store.get(2)


def test_no_temporary_files_left(tmp_path, make_corpus):
    path = make_corpus(tmp_path / "c.jsonl", ["a"])
    CorpusStore(path, progress=False).close()
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", "c.jsonl.offsets.npy"]
