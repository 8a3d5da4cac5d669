"""All-or-nothing parquet writing: a failure on any file leaves no output and no temporary file behind."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_search.data.writer import write_parquet_files

SCHEMA = pa.schema([("a", pa.int64())])


def test_writes_every_file(tmp_path):
    paths = write_parquet_files(
        {tmp_path / "x.parquet": [{"a": 1}], tmp_path / "sub" / "y.parquet": [{"a": 2}]}, SCHEMA
    )
    assert [pq.read_table(p).to_pylist() for p in paths] == [[{"a": 1}], [{"a": 2}]]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sub", "x.parquet", "y.parquet"]


def test_a_failing_file_leaves_nothing(tmp_path):
    files = {tmp_path / "good.parquet": [{"a": 1}], tmp_path / "bad.parquet": [{"a": "not an int"}]}
    with pytest.raises(pa.ArrowException):
        write_parquet_files(files, SCHEMA)
    assert list(tmp_path.iterdir()) == []


def test_no_timestamps_or_pandas_metadata(tmp_path):
    (path,) = write_parquet_files({tmp_path / "x.parquet": [{"a": 1}]}, SCHEMA)
    assert pq.read_schema(path).metadata is None
