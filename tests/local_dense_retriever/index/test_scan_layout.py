"""The CPU flat scan's matmul layout: both layouts give the exact scan's answers at every batch size, ties in id order;
'auto' times them once per machine, remembers the result and gives each batch the faster one; the server flag
reaches the index."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.index import scan_layout
from local_dense_retriever.index.scan_layout import PROBE_SIZES, LayoutChoice, nearest_probe
from local_dense_retriever.index.torch_flat import TorchFlatIndex

CPU = torch.device("cpu")
LAYOUTS = pytest.mark.parametrize("layout", ["queries_first", "rows_first"])


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _exact_ids(vectors, queries, k):
    scores = queries.astype(np.float64) @ vectors.astype(np.float64).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@LAYOUTS
@pytest.mark.parametrize("rows", [5, 8_192, 20_001])  # under one block, exactly one, several with a partial last
def test_each_layout_gives_the_exact_scan_at_every_batch_size(rng, layout, rows):
    vectors = _unit(rng, rows, 24)
    index = TorchFlatIndex(vectors, device=CPU, scan_layout=layout, prefilter="off")
    assert index.layout.describe() == layout.replace("_", " ")
    for n in (1, 2, 3, 8, 9, 33, 64, 130):
        queries = _unit(rng, n, 24)
        scores, ids = index.search(torch.from_numpy(queries), 5)
        np.testing.assert_array_equal(ids, _exact_ids(vectors, queries, min(5, rows)), err_msg=f"{n} queries")
        want = np.take_along_axis(queries @ vectors.T, ids, axis=1)
        np.testing.assert_allclose(scores, want, atol=1e-5)


@LAYOUTS
def test_equal_scores_come_in_id_order_in_each_layout(rng, layout):
    """Duplicate rows tie exactly in either layout, in one block or across blocks: the lower id first."""
    base = _unit(rng, 40, 8)
    filler = _unit(rng, scan_layout.BLOCK_ROWS, 8) * 0.01  # pushes the last copies into the second block
    vectors = np.concatenate([base, base[:5], filler, base[:5]])
    index = TorchFlatIndex(vectors, device=CPU, scan_layout=layout, prefilter="off")
    scores, ids = index.search(torch.from_numpy(base[:5]), 3)
    assert ids.tolist() == [[q, q + 40, q + 45 + len(filler)] for q in range(5)]
    assert (scores[:, 0] == scores[:, 2]).all()


def test_a_batch_takes_the_layout_that_won_at_the_nearest_probed_size():
    assert [nearest_probe(n) for n in (1, 2, 3, 5, 8, 16, 17, 64, 65, 1000)] == [1, 2, 2, 8, 8, 8, 32, 32, 128, 128]
    timings = {}
    for size in PROBE_SIZES:  # rows first wins at 2, 8 and 32 queries, as on an AMD Zen 3
        timings[f"queries_first@{size}"] = 1.0
        timings[f"rows_first@{size}"] = 0.5 if size in (2, 8, 32) else 1.2
    choice = LayoutChoice.from_timings(timings)
    assert [choice.layout(n) for n in (1, 2, 40, 64, 65, 512)] == ["queries_first", *["rows_first"] * 3,
                                                                    "queries_first", "queries_first"]  # fmt: skip
    timings["rows_first@128"] = 0.5  # rows first up to the largest probed size, as written above it (not measured)
    assert [LayoutChoice.from_timings(timings).layout(n) for n in (128, 129, 2560)] == ["rows_first", "queries_first",
                                                                                         "queries_first"]  # fmt: skip
    assert LayoutChoice.fixed("rows_first").layout(2560) == "rows_first"  # a named layout holds at every size
    timings["rows_first@128"] = 1.2
    assert choice.describe() == "rows first at 2-64 queries, else queries first"
    timings["rows_first@8"] = 1.0 / 1.05  # within the margin: the product as written stays
    assert LayoutChoice.from_timings(timings).describe() == "rows first at 2-4, 17-64 queries, else queries first"


@pytest.fixture
def counted_probe(monkeypatch, tmp_path):
    """The probe's timings made up (rows first faster at 8 queries only) and its runs counted; the cache in tmp."""
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(scan_layout, "PROBE_MIN_ROWS", 64)
    monkeypatch.setattr(scan_layout, "PROBE_ROWS", 64)
    monkeypatch.setattr(scan_layout, "machine_busy", lambda: False)
    monkeypatch.setattr(scan_layout, "_probed", {})  # this process's probes: as in a fresh server process
    runs = []

    def probe(sample, scratch, repeats=3):
        runs.append(len(sample))
        timings = {f"{name}@{size}": 1.0 for size in PROBE_SIZES for name in scan_layout.LAYOUTS}
        timings["rows_first@8"] = 0.25
        return timings

    monkeypatch.setattr(scan_layout, "probe_timings", probe)
    return runs


def test_auto_probes_once_per_machine_and_reuses_the_result(rng, tmp_path, monkeypatch, counted_probe):
    vectors = _unit(rng, 300, 16)
    first = TorchFlatIndex(vectors, device=CPU, prefilter="off")
    assert counted_probe == [64]  # a sample of the rows, not the whole index
    assert first.layout.describe() == "rows first at 5-16 queries, else queries first"
    assert "scan rows first at 5-16 queries" in first.describe()
    cached = json.loads((tmp_path / "cache" / scan_layout.PROBE_FILE).read_text())
    assert len(cached["probes"]) == 1
    assert TorchFlatIndex(vectors, device=CPU, prefilter="off").layout == first.layout  # in this process
    monkeypatch.setattr(scan_layout, "_probed", {})
    again = TorchFlatIndex(vectors, device=CPU, prefilter="off")  # a restart, another replica
    assert counted_probe == [64]
    assert again.layout == first.layout
    queries = torch.from_numpy(_unit(rng, 8, 16))
    np.testing.assert_array_equal(again.search(queries, 4)[1], _exact_ids(vectors, queries.numpy(), 4))


def test_a_probe_taken_on_a_busy_machine_serves_but_is_not_remembered(rng, tmp_path, monkeypatch, counted_probe):
    monkeypatch.setattr(scan_layout, "machine_busy", lambda: True)
    vectors = _unit(rng, 300, 16)
    assert TorchFlatIndex(vectors, device=CPU, prefilter="off").layout.layout(8) == "rows_first"
    assert not (tmp_path / "cache" / scan_layout.PROBE_FILE).exists()
    monkeypatch.setattr(scan_layout, "machine_busy", lambda: False)
    monkeypatch.setattr(scan_layout, "_probed", {})  # the next start, on a quiet machine, measures again
    TorchFlatIndex(vectors, device=CPU, prefilter="off")
    assert counted_probe == [64, 64]
    assert (tmp_path / "cache" / scan_layout.PROBE_FILE).exists()


def test_the_load_average_decides_busy(monkeypatch):
    monkeypatch.setattr(scan_layout.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(scan_layout.os, "getloadavg", lambda: (2.4, 0.0, 0.0))
    assert scan_layout.machine_busy()
    monkeypatch.setattr(scan_layout.os, "getloadavg", lambda: (1.2, 9.0, 9.0))  # the last minute counts
    assert not scan_layout.machine_busy()


def test_auto_probes_again_on_another_thread_count(rng, counted_probe):
    vectors = _unit(rng, 300, 16)
    TorchFlatIndex(vectors, device=CPU, prefilter="off")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        TorchFlatIndex(vectors, device=CPU, prefilter="off")
    finally:
        torch.set_num_threads(threads)
    assert counted_probe == [64, 64]


def test_a_memory_mapped_index_is_probed_apart_from_one_in_memory(rng, tmp_path, counted_probe):
    """A scan of a file's memory map runs at another pace than one of the process's own memory: a probe taken on
    one is not reused for the other."""
    vectors = _unit(rng, 300, 16)
    np.save(tmp_path / "flat.npy", vectors)
    TorchFlatIndex(vectors, device=CPU, prefilter="off")
    mapped = TorchFlatIndex.from_file(tmp_path / "flat.npy", device=CPU, prefilter="off")
    assert counted_probe == [64, 64]
    TorchFlatIndex.from_file(tmp_path / "flat.npy", device=CPU, prefilter="off")
    assert counted_probe == [64, 64]
    queries = torch.from_numpy(_unit(rng, 8, 16))
    np.testing.assert_array_equal(mapped.search(queries, 4)[1], _exact_ids(vectors, queries.numpy(), 4))


def test_auto_does_not_probe_a_small_index_or_a_named_layout(rng, counted_probe):
    assert TorchFlatIndex(_unit(rng, 63, 16), device=CPU).layout.describe() == "queries first"
    assert TorchFlatIndex(_unit(rng, 300, 16), device=CPU, scan_layout="rows_first").layout.describe() == "rows first"
    assert counted_probe == []


def test_an_unwritable_cache_still_probes_and_serves(rng, tmp_path, monkeypatch, counted_probe, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(blocker))
    index = TorchFlatIndex(_unit(rng, 300, 16), device=CPU, prefilter="off")
    assert counted_probe == [64]
    assert index.layout.layout(8) == "rows_first"
    assert "flat scan layout probe: cannot cache the timings" in caplog.text


def test_the_real_probe_times_every_layout_at_every_size(rng):
    sample = torch.from_numpy(_unit(rng, 500, 16))
    timings = scan_layout.probe_timings(sample, lambda r, q: torch.empty(r, q), repeats=1)
    assert set(timings) == {f"{name}@{size}" for size in PROBE_SIZES for name in scan_layout.LAYOUTS}
    assert all(t > 0 for t in timings.values())


def test_the_server_flag_reaches_the_index_and_the_fleet_shards(rng, tmp_path):
    from local_dense_retriever.retrieval_server import config_from_args
    from local_dense_retriever.serve.shards import ShardSearcher

    vectors = _unit(rng, 3_000, 16)
    np.save(tmp_path / "flat.npy", vectors)
    base = ["--index_path", str(tmp_path / "flat.npy"), "--corpus_path", str(tmp_path / "corpus.jsonl"),
            "--device", "cpu"]  # fmt: skip
    assert ServerConfig().index_scan_layout == "auto"
    config = config_from_args([*base, "--index_scan_layout", "rows_first"])[0]
    shards = [ShardSearcher(config, shard, 2) for shard in range(2)]
    assert all(s.index.layout.describe() == "rows first" for s in shards)
    with pytest.raises(SystemExit):
        config_from_args([*base, "--index_scan_layout", "sideways"])
