"""Server counters for GET /metrics, fed by what they measure: the body guard observes each request, the handler its
queries, the runner its batches and queue depth, the engine its stages and counts (through the ``EngineMeter`` it
pushes into). Invariants: ``Metrics`` is updated only from the event-loop thread (no locks; the engine's threads write
only to their meter); latency percentiles cover the most recent ``window`` requests; cumulative since start-up."""

from __future__ import annotations

import collections
import time

import numpy as np

from local_dense_retriever.engine_meter import EngineMeter
from local_dense_retriever.memory import heap_stats


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
        self.queue_depth = 0  # queries waiting or in flight, as the runner last set it
        self.engine: EngineMeter | None = None  # the loaded engine's meter: its stages and counts

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

    def set_queue_depth(self, n: int) -> None:
        self.queue_depth = n

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
            "queue_depth": self.queue_depth,
            "batches_total": self.batches,
            "failed_batches_total": self.failed_batches,
            "mean_batch_size": self.batched_queries / self.batches if self.batches else None,
            "batch_size_histogram": {f"<={k}": v for k, v in sorted(self.batch_sizes.items())},
            "latency_ms": {**pct, "window": int(lat.size)},
            "cpu_seconds": engine.cpu_seconds() if engine else None,
            "prefilter_crowded_queries_total": engine.crowded_queries if engine else 0,  # accel.prescan
            "duplicate_queries_total": engine.duplicate_queries if engine else 0,  # texts repeated in a batch
            "memory_bytes": heap_stats(),
        }
