"""All-or-nothing parquet writing: a failure on any file leaves no output and no temporary file behind."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_search.data.pipeline import write_parquet_files

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


def test_a_rerun_removes_what_a_killed_run_left(search_r1_dir, tmp_path, run_cli):
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    writer = (
        "import sys, time\n"
        "from verl_search.atomic import temporary_name\nfrom pathlib import Path\n"
        "tmp = temporary_name(Path(sys.argv[1]))\ntmp.write_bytes(b'PAR1' * 100_000)\n"
        "print('writing', flush=True)\ntime.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, str(out / "test.parquet")], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [p.name.startswith(".test.parquet.tmp-") for p in out.iterdir()] == [True]
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet", "val_subset.parquet"]
