"""The server's CPU accounting: a stage's CPU is its thread's; torch's worker threads count apart, as compute."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from local_dense_retriever.engine_meter import EngineMeter, native_threads_cpu


def test_a_stage_counts_the_cpu_it_burns_and_not_the_time_it_sleeps():
    clock = EngineMeter()
    with clock.stage("encode"):
        deadline = time.thread_time() + 0.05
        while time.thread_time() < deadline:
            pass
    with clock.stage("search"):
        time.sleep(0.1)
    snap = clock.cpu_seconds()
    assert snap["encode"] >= 0.05 and snap["wall"]["encode"] >= 0.05
    assert snap["search"] < 0.02 and snap["wall"]["search"] >= 0.1
    assert snap["lookup"] == 0 and snap["process"] >= snap["encode"]


def test_a_stage_that_raises_is_still_counted():
    clock = EngineMeter()
    with pytest.raises(ValueError), clock.stage("lookup"):
        time.sleep(0.02)
        raise ValueError("broken row")
    assert clock.cpu_seconds()["wall"]["lookup"] >= 0.02


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU times come from /proc")
def test_torch_worker_threads_count_as_native_compute():
    if torch.get_num_threads() < 2:
        pytest.skip("torch runs on one thread here: no worker threads")
    before = native_threads_cpu()
    a = torch.randn(512, 512)
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        a @ a
    assert native_threads_cpu() - before > 0.1
