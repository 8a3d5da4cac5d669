"""Server counters for GET /metrics, and where its CPU time goes (``cpu_seconds``): the engine's stages against the
whole process. Invariants: ``Metrics`` is updated only from the event-loop thread (no locks); latency percentiles
cover the most recent ``window`` requests. A stage's time is its thread's; native threads (OpenMP workers) run no
Python, so theirs is compute (``native_threads``); the rest is the service's own overhead. Cumulative since start-up."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from local_dense_retriever.memory import heap_stats

if TYPE_CHECKING:
    from local_dense_retriever.engine import RetrievalEngine

STAGES = ("encode", "search", "lookup", "rerank")


class StageClock:
    """Cumulative CPU and wall seconds per engine stage, from every thread that runs the engine."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self.wall = dict.fromkeys(STAGES, 0.0)
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
            with self._lock:
                self.cpu[name] += cpu
                self.wall[name] += wall

    def snapshot(self) -> dict:
        """``{process, native_threads, encode, search, lookup, rerank}`` CPU seconds and the stages' wall seconds."""
        with self._lock:
            cpu, wall = dict(self.cpu), dict(self.wall)
        return {
            "process": time.process_time(),
            "native_threads": native_threads_cpu(),
            **cpu,
            "wall": wall,
        }


def native_threads_cpu() -> float | None:
    """CPU seconds of this process's threads that run no Python; None where ``/proc`` has no per-thread times."""
    python = {t.native_id for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        if int(tid) in python:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15)
    return total


class Metrics:
    """In-process counters of one server."""

    def __init__(self, *, window: int = 10_000) -> None:
        self.started = time.time()
        self.requests = 0
        self.queries = 0
        self.status_counts: collections.Counter[int] = collections.Counter()
        self.error_counts: collections.Counter[str] = collections.Counter()
        self.batches = 0
        self.batched_queries = 0
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # bucket upper bound (power of two)
        self.failed_batches = 0
        self._latencies: collections.deque[float] = collections.deque(maxlen=window)
        self.queue_depth: Callable[[], int] = lambda: 0
        self.engine: RetrievalEngine | None = None  # once loaded: its stage clock and counters are reported

    def observe_request(self, status: int, latency_s: float, error: str | None = None) -> None:
        """One request answered ``status`` (499: its client went away first), labelled with its error's kind."""
        self.requests += 1
        self.status_counts[status] += 1
        if error:
            self.error_counts[error] += 1
        self._latencies.append(latency_s)

    def observe_queries(self, n: int) -> None:
        """The queries of one request that parsed (counted whether or not it is answered)."""
        self.queries += n

    def observe_batch(self, size: int, *, failed: bool = False) -> None:
        self.batches += 1
        self.batched_queries += size
        self.batch_sizes[1 << max(size - 1, 0).bit_length()] += 1
        if failed:
            self.failed_batches += 1

    def snapshot(self) -> dict:
        engine = self.engine
        lat = np.asarray(self._latencies, dtype=np.float64)
        pct = {f"p{p}": (float(np.percentile(lat, p)) * 1000 if lat.size else None) for p in (50, 90, 99)}
        return {
            "uptime_s": time.time() - self.started,
            "requests_total": self.requests,
            "queries_total": self.queries,
            "responses_by_status": {str(k): v for k, v in sorted(self.status_counts.items())},
            "errors_by_kind": dict(self.error_counts),
            "queue_depth": self.queue_depth(),
            "batches_total": self.batches,
            "failed_batches_total": self.failed_batches,
            "mean_batch_size": self.batched_queries / self.batches if self.batches else None,
            "batch_size_histogram": {f"<={k}": v for k, v in sorted(self.batch_sizes.items())},
            "latency_ms": {**pct, "window": int(lat.size)},
            "cpu_seconds": engine.clock.snapshot() if engine else None,
            "prefilter_crowded_queries_total": engine.prefilter_crowded() if engine else 0,  # accel.prescan
            "duplicate_queries_total": engine.duplicate_queries if engine else 0,  # texts repeated in a batch
            "memory_bytes": heap_stats(),
            **({"web": web} if engine and (web := engine.backend_stats()) is not None else {}),
        }
