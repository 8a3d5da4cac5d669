"""The index-scan interface (:class:`ShardScan`: ``topk(queries, k)`` -> float32 scores and int64 shard rows, CPU
tensors ``(n, k)``, best first, equal scores by lower id; ``crowded_queries``, those that needed more than its usual
work) and :class:`ExactScan`, the plain scan; :data:`ScanWrapper` builds another around a CPU shard's exact one
(``accel``). Invariant: every scan returns what :class:`ExactScan` returns, up to float rounding."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import torch

from local_dense_retriever.index.topk import block_topk, grouped_topk
from local_dense_retriever.load_progress import LoadProgress

#: rows scored per matmul on CPU, bounding the (queries x rows) score buffer
CPU_CHUNK_ROWS = 1 << 18
#: the most memory the score buffer of one step may take on any device (the server's --score_buffer_mb)
SCORE_BYTES = 1 << 30
#: the largest CPU score buffer a thread keeps: glibc's largest mmap threshold (larger blocks cannot fragment the heap)
RETAINED_SCORE_BYTES = 32 << 20
#: ``(lo, hi)``: told that a scan being built is done reading rows ``lo:hi`` of the shard (a memory map's pages leave)
RowsRead = Callable[[int, int], object]


class ShardScan(Protocol):
    """Top-k search over one shard's rows (see the module docstring)."""

    crowded_queries: int

    def topk(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def describe(self) -> str: ...


class ScoreBuffers(threading.local):
    """Each thread's CPU score buffer, grown to its largest step and reused (a fresh one per batch fragmented the
    heap); steps above :data:`RETAINED_SCORE_BYTES` get their own."""

    buffer: torch.Tensor | None = None  # bytes, viewed as each step's dtype

    def scores(self, queries: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``(queries, rows)`` tensor of ``dtype`` for a matmul to write into; its contents are undefined."""
        need = queries * rows * dtype.itemsize
        if need > RETAINED_SCORE_BYTES:
            return torch.empty((queries, rows), dtype=dtype)
        if self.buffer is None or self.buffer.numel() < need:
            self.buffer = None  # the old one is freed before the larger one is taken
            self.buffer = torch.empty(need, dtype=torch.uint8)
        return self.buffer[:need].view(dtype).view(queries, rows)


class ExactScan:
    """Every row scored in the shard's dtype on its device, a step of rows at a time, each step cut to its top k."""

    crowded_queries = 0

    def __init__(self, rows: torch.Tensor, *, score_bytes: int = SCORE_BYTES, chunk_rows: int = CPU_CHUNK_ROWS):
        """``score_bytes`` bounds one step's score buffer; on the CPU a step also holds at most ``chunk_rows``."""
        self.rows = rows
        self.score_bytes = max(1, score_bytes)
        self.chunk_rows = max(1, chunk_rows)
        self.buffers = ScoreBuffers()

    def rows_per_step(self, queries: int) -> int:
        """Rows scored per matmul: as many as keep the score buffer within the bounds, at least one."""
        rows = self.score_bytes // max(1, queries * self.rows.element_size())
        if self.rows.device.type == "cpu":
            rows = min(rows, self.chunk_rows)
        return max(1, min(rows, self.rows.shape[0]))

    def topk(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        shard = self.rows
        q = queries.to(device=shard.device, dtype=shard.dtype)
        step = self.rows_per_step(len(q))
        # a GPU selects from steps of a million rows and more in two passes; on the CPU one pass is as fast
        select = grouped_topk if shard.device.type == "cuda" else block_topk
        best_s, best_i = [], []
        for lo in range(0, shard.shape[0], step):
            rows = shard[lo : lo + step]
            if shard.device.type == "cpu":  # into this thread's buffer (a GPU's caching allocator reuses its own)
                scores = torch.matmul(q, rows.T, out=self.buffers.scores(len(q), len(rows), shard.dtype))
            else:
                scores = q @ rows.T
            # top-k in the index's dtype (its matmul's own rounding), then only k scores per query made float32
            s, i = select(scores, k, lo)
            best_s.append(s.float().cpu())
            best_i.append(i.cpu())
        if len(best_s) == 1:
            return best_s[0], best_i[0]
        s, at = block_topk(torch.cat(best_s, dim=1), k)  # ties by position: steps are in id order
        return s, torch.gather(torch.cat(best_i, dim=1), 1, at)

    def describe(self) -> str:
        return "exact scan"


#: ``(exact, rows_read, progress)``: another scan of a CPU shard, built around its exact scan; ``rows_read`` is told
#: each step of the shard's rows it has read, ``progress`` (None: not logged) what it reads
ScanWrapper = Callable[[ExactScan, RowsRead, LoadProgress | None], ShardScan]
