"""The CPU flat scan's matmul layout, chosen per batch size by timing both on this CPU.

A float32 scan scores a batch as ``queries @ rows.T``. How fast the BLAS runs that product depends on the CPU and on the
batch: on an AMD Zen 3 MKL takes twice as long for 2 queries as for 1, and the same product computed rows first (``rows
@ queries.T`` in blocks that stay in cache, each copied back transposed) is 1.9-3.1x faster at 2-8 queries and 1.3-1.5x
at 32-64, while at 1 and at 256 queries the two are even (``benchmarks/cpu_scan_layout.py``). Other CPUs' BLAS may rank
them otherwise, so ``auto`` times both at a few batch sizes on a sample of the index, once per CPU, torch version,
thread count and dimension (remembered beside the encoder's precision probes; not when the machine was busy, which can
rank them by what the other work did), and each batch takes the layout that won at the probed size nearest to its own:
rows first only where it was at least 1.1x faster, and not above the largest probed size.

Invariant: both layouts give every query the same top-k as each other and as faiss's exact scan, up to float rounding
(the scores of one (query, row) pair may differ in the last bits between layouts and batch sizes, as BLAS kernels do).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from local_dense_retriever import precision_cache
from local_dense_retriever.cpu_features import best_seconds

logger = logging.getLogger(__name__)

ScanLayout = Literal["auto", "queries_first", "rows_first"]
LAYOUTS: tuple[str, ...] = ("queries_first", "rows_first")
#: rows per block of the rows-first product: its (block x queries) scratch stays in L2 / L3 (2 MB at 64 queries)
BLOCK_ROWS = 8192
#: the batch sizes ``auto`` times; a batch takes the layout that won at the nearest of them (on a log scale)
PROBE_SIZES = (1, 2, 8, 32, 128)
#: rows of the index the probe scans: enough to stream from memory as the whole index does (50 MB at 384 dimensions,
#: more than a server CPU's L3 slice), few enough that the probe takes about a second
PROBE_ROWS = 32768
#: 'auto' probes only indexes of at least this many rows; smaller ones scan queries first (a probe would cost more
#: than it saves)
PROBE_MIN_ROWS = PROBE_ROWS
PROBE_FILE = "scan_layout_probes.json"
#: rows first is taken at a size only where the probe found it at least this much faster: where the two are even the
#: product as written stays, and noise cannot flip it
MARGIN = 1.1

#: ``(queries, rows, out, scratch)`` -> ``out`` holding ``queries @ rows.T``; ``scratch(n_rows, n_queries)`` lends a
#: reusable buffer
Scratch = Callable[[int, int], torch.Tensor]


def queries_first(queries: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """``queries @ rows.T`` as one product into ``out``."""
    return torch.matmul(queries, rows.T, out=out)


def rows_first(queries: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """``queries @ rows.T`` computed as ``rows @ queries.T`` in blocks of :data:`BLOCK_ROWS`, each block's
    ``(block x queries)`` product copied transposed into ``out``."""
    transposed = queries.T
    part = scratch(min(BLOCK_ROWS, len(rows)), len(queries))
    for lo in range(0, len(rows), BLOCK_ROWS):
        block = rows[lo : lo + BLOCK_ROWS]
        product = torch.matmul(block, transposed, out=part[: len(block)])
        out[:, lo : lo + len(block)].copy_(product.T)
    return out


PRODUCTS = {"queries_first": queries_first, "rows_first": rows_first}


def nearest_probe(n: int) -> int:
    """The probed batch size nearest to ``n`` on a log scale (ties: the smaller)."""
    return min(PROBE_SIZES, key=lambda size: (abs(math.log2(max(1, n)) - math.log2(size)), size))


@dataclass(frozen=True)
class LayoutChoice:
    """The layout per probed batch size, the one above the largest (``beyond``), and the probe's timings (seconds;
    empty when a layout was named)."""

    by_size: dict[int, str]
    timings: dict[str, float]
    #: batches above the largest probed size: queries first, as written, unless a layout was named (not measured
    #: there; on the Zen 3 rows first lost at 256 queries, 0.89-0.92x)
    beyond: str = "queries_first"

    @classmethod
    def fixed(cls, layout: str) -> LayoutChoice:
        return cls(dict.fromkeys(PROBE_SIZES, layout), {}, layout)

    @classmethod
    def from_timings(cls, timings: dict[str, float]) -> LayoutChoice:
        """Rows first where it was at least :data:`MARGIN` times faster at a size, else queries first."""
        by_size = {}
        for size in PROBE_SIZES:
            q, r = timings[f"queries_first@{size}"], timings[f"rows_first@{size}"]
            by_size[size] = "rows_first" if r * MARGIN <= q else "queries_first"
        return cls(by_size, dict(timings))

    def layout(self, n_queries: int) -> str:
        """The layout of a batch of ``n_queries``."""
        return self.beyond if n_queries > PROBE_SIZES[-1] else self.by_size[nearest_probe(n_queries)]

    def product(self, n_queries: int):
        return PRODUCTS[self.layout(n_queries)]

    def describe(self) -> str:
        """e.g. ``rows first at 2-64 queries, else queries first``, or ``queries first``."""
        runs: list[list[int]] = []  # [first, last] batch sizes of each run of rows first
        for n in range(1, PROBE_SIZES[-1] + 2):  # and one beyond the largest probe
            if self.layout(n) == "rows_first":
                if runs and runs[-1][1] == n - 1:
                    runs[-1][1] = n
                else:
                    runs.append([n, n])
        if not runs:
            return "queries first"
        if runs == [[1, PROBE_SIZES[-1] + 1]]:
            return "rows first"
        last = PROBE_SIZES[-1] + 1
        spans = [f"{a}+" if b == last else (f"{a}" if a == b else f"{a}-{b}") for a, b in runs]
        return f"rows first at {', '.join(spans)} queries, else queries first"


def probe_timings(sample: torch.Tensor, scratch: Scratch, repeats: int = 3) -> dict[str, float]:
    """Both layouts' best time of ``repeats`` at each of :data:`PROBE_SIZES`, taking turns, over ``sample``'s rows."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.empty(PROBE_SIZES[-1], len(sample), dtype=sample.dtype)  # each size writes its first rows
    runs = {}
    for size in PROBE_SIZES:
        queries = torch.randn(size, sample.shape[1], generator=gen, dtype=sample.dtype)
        for name, product in PRODUCTS.items():
            runs[f"{name}@{size}"] = lambda p=product, q=queries, o=scores[:size]: p(q, sample, o, scratch)
    return best_seconds(runs, repeats=repeats)


def probe_bytes(dim: int, itemsize: int = 4) -> int:
    """The most memory a probe adds while it runs, whatever the index's size: the sample's rows read, the scores of
    the largest probed batch and the rows-first scratch at that batch (68 MiB at 384 dimensions in float32)."""
    most = PROBE_SIZES[-1]
    return (PROBE_ROWS * dim + most * PROBE_ROWS + BLOCK_ROWS * most) * itemsize


def probe_key(dim: int, dtype: torch.dtype, mapped: bool) -> str:
    """What the probe's result depends on, hashed: the CPU, torch's version and thread count, the vectors' shape, and
    whether they are a file's memory map or the process's own memory (a scan of a mapped index runs at another pace,
    and the layouts can rank otherwise there)."""
    parts = ["flat scan layout", precision_cache.cpu_model(), torch.__version__, str(torch.get_num_threads()),
             str(dim), str(dtype), str(PROBE_ROWS), str(BLOCK_ROWS), "mapped" if mapped else "own"]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def machine_busy() -> bool:
    """Whether other work keeps this machine's CPUs busy (the 1-minute load average at or above the CPUs this process
    may use): a probe taken then may rank the layouts by what the other work did to them."""
    try:
        return os.getloadavg()[0] >= len(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return False


#: this process's probes by :func:`probe_key` (an index loaded again, each fleet shard: one probe per process)
_probed: dict[str, dict[str, float]] = {}


def choose_layout(layout: str, shard: torch.Tensor, scratch: Scratch, mapped: bool = False) -> LayoutChoice:
    """The layout for scanning ``shard`` (a CPU tensor): a named one as is; under ``auto``, queries first for a small
    index, else the probe's choice, measured once per machine (:func:`probe_key`; ``mapped``: ``shard`` is a file's
    memory map) and remembered. A probe taken while
    the machine is busy (:func:`machine_busy`) serves this process but is not remembered: a later start measures
    again."""
    if layout != "auto":
        return LayoutChoice.fixed(layout)
    if len(shard) < PROBE_MIN_ROWS:
        return LayoutChoice.fixed("queries_first")
    key = probe_key(shard.shape[1], shard.dtype, mapped)
    names = tuple(f"{name}@{size}" for size in PROBE_SIZES for name in LAYOUTS)
    timings = _probed.get(key) or precision_cache.cached_timings(
        key, names=names, file_name=PROBE_FILE, what="the flat scan's layout"
    )
    if timings is None:
        timings = probe_timings(shard[:PROBE_ROWS], scratch)
        if machine_busy():
            logger.info("flat scan layout probe: the machine is busy, so its result is used but not remembered")
        else:
            precision_cache.remember(key, timings, file_name=PROBE_FILE, what="flat scan layout probe")
    _probed[key] = timings
    choice = LayoutChoice.from_timings(timings)
    logger.info("flat scan layout: %s (%s)", choice.describe(), probe_summary(timings))
    return choice


def probe_summary(timings: dict[str, float]) -> str:
    """Per probed size, rows first's speed over queries first's, e.g. ``1: 1.00x, 2: 3.10x``."""
    return ", ".join(
        f"{size}: {timings[f'queries_first@{size}'] / timings[f'rows_first@{size}']:.2f}x" for size in PROBE_SIZES
    )
