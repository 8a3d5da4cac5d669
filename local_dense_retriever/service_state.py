"""One server's lifecycle: loading → ready (engine + runner) or failed, its metrics and watchdog, and the body of
GET /health. Invariant: a runner exists only once the engine is loaded; ``healthy`` is what a supervisor asks."""

from __future__ import annotations

import functools
import logging

from local_dense_retriever.batcher import Batcher, estimate_tokens
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.memory import gpu_report
from local_dense_retriever.metrics import Metrics
from local_dense_retriever.request_runners import DocumentRunner, PerRequestRunner
from local_dense_retriever.watchdog import Watchdog

logger = logging.getLogger(__name__)


class ServiceState:
    """Lifecycle of one server: loading → ready (engine + runner) or failed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.status = "loading"
        self.detail = "loading model, index and corpus"
        self.engine: RetrievalEngine | None = None
        self.runner: Batcher | PerRequestRunner | DocumentRunner | None = None
        #: CUDA ordinals of the GPUs the loaded engine uses (GET /health ``gpus``)
        self.gpus: list[int] = []
        self.watchdog = Watchdog(
            stalled_for=lambda now: self.runner.stalled_for(now) if self.runner is not None else 0.0,
            describe=lambda: self.runner.describe_state() if self.runner is not None else {"status": self.status},
            stall_s=config.watchdog_stall_s,
            loop_block_s=config.watchdog_loop_block_s,
        )

    @property
    def healthy(self) -> bool:
        """Ready, its worker running, and the watchdog sees nothing stuck (what a supervisor's check asks)."""
        runner = self.runner
        ready = self.status == "ready" and runner is not None and runner.running
        return ready and self.watchdog.current_problem() is None

    def set_ready(self, engine: RetrievalEngine) -> None:
        c = self.config
        if engine.corpus is None:  # a document backend (web): each request awaits its own live calls
            self.runner = DocumentRunner(engine, max_queue=c.max_queue, metrics=self.metrics)
        elif c.batching:
            self.runner = Batcher(
                engine.search,
                max_batch_size=c.max_batch_size,
                max_batch_tokens=c.max_batch_tokens,
                cost=functools.partial(estimate_tokens, cap=c.query_max_length),
                max_wait_s=c.max_wait_ms / 1000,
                max_queue=c.max_queue,
                metrics=self.metrics,
            )
        else:
            threads = c.unbatched_threads or (1 if engine.encodes_on_gpu else 40)
            self.runner = PerRequestRunner(engine.search, threads=threads, max_queue=c.max_queue, metrics=self.metrics)
            logger.info("per-request mode: %d thread%s", threads, "" if threads == 1 else "s")
        self.runner.start()
        self.metrics.engine = engine.meter  # the engine's threads push its stages and counts there
        self.gpus = engine.gpus()
        self.engine = engine
        self.status, self.detail = "ready", engine.describe()

    def metrics_report(self) -> dict:
        """The body of GET /metrics: the metrics, and the web backend's own block (its cache is shared with other
        processes, so its figures are read when asked)."""
        report = self.metrics.snapshot()
        web = self.engine.backend_stats() if self.engine is not None else None
        return report if web is None else {**report, "web": web}


def health_report(state: ServiceState) -> dict:
    """The body of GET /health (its status code: 200 when ``state.healthy``, else 503)."""
    detail = state.engine.describe() if state.status == "ready" and state.engine is not None else state.detail
    body = {"status": state.status, "detail": detail}  # described when asked: the web backend's counts move
    if state.status == "ready" and not state.healthy:
        problem = state.watchdog.current_problem() or "the batching worker is not running"
        body = {"status": "stuck", "detail": f"{problem}; restart the server if this lasts"}
    if state.engine is not None:
        body["passages"] = state.engine.passages
        body["batching"] = state.config.batching
        body["pages"] = len(state.engine.page_file) if state.engine.page_file is not None else None
        body["gpus"] = gpu_report(state.gpus)
        body["index"] = state.engine.index_report(state.config.topk)
    return body
