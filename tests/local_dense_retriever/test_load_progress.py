"""Progress lines while an index loads: the readers that stream a real faiss flat file (onto a device in another
precision, into faiss, into a CPU pre-scan copy) count what they read, and the load logs it every few seconds (here
every step: the interval is 0, so no timing is asserted)."""

from __future__ import annotations

import logging
import re

import faiss
import numpy as np
import pytest
import torch

from local_dense_retriever.index.faiss_index import read_index
from local_dense_retriever.index.flat_file import read_flat_vectors, vector_file
from local_dense_retriever.index.torch_flat import TorchFlatIndex
from local_dense_retriever.load_progress import LoadProgress, format_bytes

ROWS, DIM = 6_000, 64  # 1.5 MiB of float32 rows
COUNT = re.compile(
    r"^loading (?P<what>.+): (?P<done>[\d.]+) of (?P<total>[\d.]+) (?P<unit>\w+) \((?P<pct>\d+)%\), \d+ s$"
)


@pytest.fixture(scope="module")
def flat_file(tmp_path_factory):
    vectors = np.random.default_rng(5).standard_normal((ROWS, DIM)).astype(np.float32)
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    path = tmp_path_factory.mktemp("progress") / "flat.index"
    faiss.write_index(index, str(path))
    return path


def counts(caplog, what: str) -> list[re.Match]:
    lines = [r.getMessage() for r in caplog.records if r.name == "local_dense_retriever.load_progress"]
    return [m for line in lines if (m := COUNT.match(line)) and m["what"] == what]


def assert_rises_to_the_whole(found: list[re.Match], steps: int, total: str) -> None:
    assert len(found) >= steps, [m.string for m in found]
    percents = [int(m["pct"]) for m in found]
    assert percents == sorted(percents) and percents[-1] == 100
    assert {m["total"] + " " + m["unit"] for m in found} == {total}


def test_streaming_onto_a_device_logs_its_progress(flat_file, caplog):
    caplog.set_level(logging.INFO, logger="local_dense_retriever.load_progress")
    progress = LoadProgress("torch index", every_s=0)
    step = 500 * DIM * 4  # 12 steps of 500 rows
    index = TorchFlatIndex(vector_file(flat_file), device=torch.device("cpu"), dtype="bfloat16", staging_bytes=step,
                           progress=progress)  # fmt: skip
    assert len(index) == ROWS and progress.done == progress.total == ROWS * DIM * 4
    assert_rises_to_the_whole(counts(caplog, "torch index"), 12, "1.5 MiB")


def test_reading_into_faiss_logs_its_progress(flat_file, caplog):
    caplog.set_level(logging.INFO, logger="local_dense_retriever.load_progress")
    progress = LoadProgress("faiss index", every_s=0)
    index = read_index(flat_file, progress, chunk_bytes=256 << 10)
    assert index.ntotal == ROWS and progress.done == progress.total == flat_file.stat().st_size
    assert_rises_to_the_whole(counts(caplog, "faiss index"), 6, "1.5 MiB")


@pytest.mark.parametrize("coarse", ["bfloat16", "int8"])
def test_the_cpu_pre_scan_copy_logs_its_progress(flat_file, caplog, coarse):
    from local_dense_retriever.accel.prescan import Prescan
    from local_dense_retriever.accel.rule import COPIES

    caplog.set_level(logging.INFO, logger="local_dense_retriever.load_progress")
    progress = LoadProgress("torch index", every_s=0)
    scan = Prescan.wrapper(COPIES[coarse], step_bytes=1_000 * DIM * 4)
    TorchFlatIndex(read_flat_vectors(flat_file), device=torch.device("cpu"), cpu_scan=scan, progress=progress)
    passes = 2 if coarse == "int8" else 1
    assert progress.done == progress.total == passes * ROWS * DIM * 4
    assert_rises_to_the_whole(counts(caplog, "torch index"), 6, format_bytes(progress.total))


def test_lines_are_spaced_by_the_interval(caplog):
    caplog.set_level(logging.INFO, logger="local_dense_retriever.load_progress")
    progress = LoadProgress("corpus", every_s=3600)
    progress.expect(10 << 30)
    for _ in range(10):
        progress.add(1 << 30)
    assert counts(caplog, "corpus") == []  # an hour between lines: none yet
    assert progress.line().startswith("loading corpus: 10.0 of 10.0 GiB (100%), ")
    rows = LoadProgress("page urls", unit="rows")
    rows.expect(21_015_324)
    rows.add(4_203_065)
    assert rows.line().startswith("loading page urls: 4,203,065 of 21,015,324 rows (20%), ")


def test_sizes_read_in_binary_units():
    assert [format_bytes(n) for n in (512, 1_536, 75 << 10, 812 << 20, int(61.3 * (1 << 30)))] == [
        "512 B", "1.5 KiB", "75 KiB", "812 MiB", "61.3 GiB",
    ]  # fmt: skip
