"""TorchFlatIndex: exact inner-product search as matmul + top-k, on CPU or sharded over every visible GPU.

Invariant: results equal an exact flat inner-product scan (faiss IndexFlatIP) up to float rounding; ids are global rows;
equal scores come in id order, whatever the chunking.
"""

from __future__ import annotations

import logging
import threading
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.index.flat_file import (  # read_flat_header and the rest: imported from here too
    STAGING_BYTES,
    FlatHeader,
    VectorFile,
    read_flat_header,
    read_flat_vectors,
    row_blocks,
    vector_file,
)
from local_dense_retriever.index.placement import shard_bounds, shard_devices
from local_dense_retriever.index.prefilter import CoarseCopy, prefiltered_topk
from local_dense_retriever.index.prefilter_choice import (  # the choice of a pre-scan: imported from here too
    COPIES,
    auto_prefilter_dtype,
    resolve_index_dtype,
    resolve_prefilter,
)
from local_dense_retriever.index.scan_layout import PROBE_ROWS, LayoutChoice, choose_layout
from local_dense_retriever.index.topk import block_topk, grouped_topk, merge_topk
from local_dense_retriever.load_progress import LoadProgress
from local_dense_retriever.memory import release_mapped_pages

logger = logging.getLogger(__name__)
__all__ = [
    "CPU_CHUNK_ROWS", "SCORE_BYTES", "STAGING_BYTES", "FlatHeader", "TorchFlatIndex", "VectorFile",
    "auto_prefilter_dtype", "index_source", "read_flat_header", "read_flat_vectors", "resolve_index_dtype",
    "resolve_prefilter", "vector_file",
]  # fmt: skip

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: rows scored per matmul on CPU, bounding the (queries x rows) score buffer
CPU_CHUNK_ROWS = 1 << 18
#: the most memory the (queries x rows) score buffer of one step of a search may take on any device: a GPU shard is
#: scanned in as many steps as this needs (at wiki-18 scale, one step over a whole 21M-row shard would need
#: batch x 21M x 2 bytes, 21 GB at 512 queries, beside the 32 GB index); the server's --score_buffer_mb
SCORE_BYTES = 1 << 30


#: the largest CPU score buffer a thread keeps for reuse: glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on
#: 64-bit); a larger block is always mapped and unmapped on its own, so it cannot fragment the heap
RETAINED_SCORE_BYTES = 32 << 20


class ScoreBuffers(threading.local):
    """Each calling thread's CPU score buffer, grown to the largest (queries x rows) step it has scored and reused.

    A fresh buffer per batch (64 queries x 100k rows: 25.6 MB) came from glibc's heap, whose mmap threshold rises to
    such sizes after the first one is freed; the smaller allocations that landed between them fragmented the heap and
    a long-running server's RSS moved between levels one buffer apart (benchmarks/RESULTS.md, issue 29). One buffer
    per thread (the batcher's engine thread; each thread of the per-request mode) is never freed, so it cannot
    fragment the heap. Steps that need more than :data:`RETAINED_SCORE_BYTES` get a buffer of their own, as before:
    malloc maps those apart from the heap, and a thread never holds more than that between searches.
    """

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


#: under 'auto', the pre-scan is given up when more than this share of the (query, block) pairs of its first queries
#: (at least this many) crowd: each such pair costs about a float32 scan of the block for the query
CROWDED_GIVE_UP = 0.5
CROWDED_TRIAL = 1024


def index_source(path: Path, device: torch.device, dtype: str = "auto") -> np.ndarray | VectorFile:
    """What to build shards from: the memory map when the shards are the file's own float32 rows on the CPU, else
    the file to stream (nothing of it mapped)."""
    if device.type == "cpu" and resolve_index_dtype(dtype, device) == "float32":
        return read_flat_vectors(path)
    return vector_file(path)


def _row_bytes(vectors: np.ndarray | VectorFile) -> int:
    """Bytes of one row of ``vectors`` as stored (a file's rows are float32)."""
    return int(vectors.shape[1]) * (4 if isinstance(vectors, VectorFile) else vectors.itemsize)


def _as_tensor(rows: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # memory-mapped arrays are read-only; we never write to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(rows))


def _release_rows(vectors: np.ndarray | VectorFile, lo: int, hi: int) -> None:
    """Drop this process's pages of rows ``lo:hi`` of a read-only memory-mapped index (``release_mapped_pages``)."""
    if isinstance(vectors, np.memmap):
        release_mapped_pages(vectors[lo:hi])


def _count_rows(rows_read, progress: LoadProgress, row_bytes: int, lo: int, hi: int) -> None:
    """``rows_read(lo, hi)``, then ``progress`` told the bytes of rows ``lo:hi``."""
    rows_read(lo, hi)
    progress.add((hi - lo) * row_bytes)


class TorchFlatIndex:
    """Flat IP index held as torch shards: one on CPU, or one per visible GPU."""

    def __init__(
        self,
        vectors: np.ndarray | VectorFile,
        *,
        device: torch.device,
        dtype: str = "auto",
        cpu_chunk_rows: int = CPU_CHUNK_ROWS,
        staging_bytes: int = STAGING_BYTES,
        score_bytes: int = SCORE_BYTES,
        prefilter: str = "auto",
        scan_layout: str = "auto",
        progress: LoadProgress | None = None,
    ) -> None:
        """Shards of ``vectors``: a float32 array on the CPU is used as is (a memory map stays one); anything else
        (GPUs, another dtype) is filled step by step through ``staging_bytes`` of host memory, from a file without
        mapping it (:class:`VectorFile`). ``score_bytes`` bounds the score buffer of one step of a search
        (:data:`SCORE_BYTES`). ``prefilter`` (:func:`resolve_prefilter`): a float32 CPU index also keeps a coarse
        copy (bfloat16: half its size again; int8: a quarter) that every search scans first, scoring in float32 only
        the rows that can be in the top k; the answers stay float32's. ``scan_layout`` (``index.scan_layout``): how
        the CPU scan's matmul is laid out, per batch size ('auto': timed on this CPU once, then remembered).
        ``progress`` is told what each copy reads of ``vectors`` (a float32 map kept as it is reads nothing)."""
        self.dtype = _DTYPES[resolve_index_dtype(dtype, device)]
        self._chunk = max(1, cpu_chunk_rows)
        self._score_bytes = max(1, score_bytes)
        self._buffers = ScoreBuffers()
        self._scratch = ScoreBuffers()  # the rows-first layout's (block x queries) products
        self.dim = int(vectors.shape[1])
        self._n = int(vectors.shape[0])
        self.device = device
        #: the devices holding the shards, in row order
        self.devices = shard_devices(device)
        self._shards: list[tuple[int, torch.Tensor]] = []
        zero_copy = isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 and self.dtype == torch.float32
        copied = not (zero_copy and device.type == "cpu")
        if progress is not None and copied:
            progress.expect(self._n * _row_bytes(vectors))
        for dev, (lo, hi) in zip(self.devices, shard_bounds(self._n, len(self.devices)), strict=True):
            if not copied:
                part = _as_tensor(vectors[lo:hi])
            else:  # host memory used by the copy does not grow with the index
                part = torch.empty((hi - lo, self.dim), dtype=self.dtype, device=dev)
                blocks = row_blocks(vectors, lo, hi, staging_bytes, pin=dev.type == "cuda", progress=progress)
                for a, block in blocks:
                    part[a - lo : a - lo + len(block)].copy_(torch.from_numpy(block))
            self._shards.append((lo, part))
        #: the CPU scan's matmul layout per batch size (a GPU's scan is always queries first)
        self.layout: LayoutChoice = LayoutChoice.fixed("queries_first")
        if device.type == "cpu":
            mapped = zero_copy and isinstance(vectors, np.memmap)
            self.layout = choose_layout(scan_layout, self._shards[0][1], self._scratch_for, mapped)
            _release_rows(vectors, 0, PROBE_ROWS)  # what the probe read (a memory map's own pages: no-op else)
        #: the coarse copy of the one CPU shard, when searches pre-scan it
        self._prefilter: CoarseCopy | None = None
        #: 'auto' turns the pre-scan off if most queries crowd (``_give_up_if_crowded``); a named dtype never does
        self._prefilter_auto = prefilter == "auto"
        coarse = resolve_prefilter(prefilter, device, dtype, (self._n, self.dim))
        if coarse is not None:
            # each step's rows leave RSS once read: searches read only their candidates' rows from the file
            rows_read = partial(_release_rows, vectors)
            if progress is not None:
                progress.expect(COPIES[coarse].passes * self._n * self.dim * 4)
                rows_read = partial(_count_rows, rows_read, progress, self.dim * 4)
            self._prefilter = COPIES[coarse].of(self._shards[0][1], max(1, staging_bytes // (self.dim * 4)), rows_read)
        #: queries whose scores crowded within the pre-scan's margin beyond the rows it keeps (``index.prefilter``)
        self.crowded_queries = 0
        self._prefiltered_queries = 0
        #: (query, block) pairs the pre-scan scanned, and those of them that crowded (``Prescanned``)
        self._scanned_blocks = self._crowded_blocks = 0
        self._count_lock = threading.Lock()

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        device: torch.device,
        dtype: str = "auto",
        score_bytes: int = SCORE_BYTES,
        prefilter: str = "auto",
        scan_layout: str = "auto",
        progress: LoadProgress | None = None,
    ) -> TorchFlatIndex:
        """The index of ``path``: memory-mapped when it stays float32 on the CPU (no copy, instant), else streamed
        (``progress`` told the bytes read)."""
        source = index_source(Path(path), device, dtype)
        return cls(source, device=device, dtype=dtype, score_bytes=score_bytes, prefilter=prefilter,
                   scan_layout=scan_layout, progress=progress)  # fmt: skip

    def __len__(self) -> int:
        return self._n

    def describe(self) -> str:
        where = f"{len(self._shards)} x {self.device.type}"
        pre = f", {self._prefilter.name} pre-scan" if self._prefilter is not None else ""
        layout = f", scan {self.layout.describe()}" if self.device.type == "cpu" else ""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"torch flat IP, {self._n:,} x {self.dim} {dtype} on {where}{pre}{layout}"

    def _scratch_for(self, rows: int, queries: int) -> torch.Tensor:
        """This thread's reusable ``(rows x queries)`` buffer for the rows-first layout's block products."""
        return self._scratch.scores(rows, queries, self.dtype)

    @property
    def coarse_copy(self) -> CoarseCopy | None:
        """The copy searches pre-scan (``index.prefilter``), or None when they scan in float32 alone."""
        return self._prefilter

    @property
    def crowded_block_share(self) -> float:
        """The share of the (query, block) pairs pre-scanned so far that crowded (what 'auto' gives the pre-scan up
        on: :meth:`_give_up_if_crowded`); 0 before any."""
        with self._count_lock:
            return self._crowded_blocks / max(1, self._scanned_blocks)

    def _rows_per_step(self, shard: torch.Tensor, queries: int) -> int:
        """Rows scored per matmul: as many as keep the score buffer within ``score_bytes`` (and, on the CPU, within
        ``cpu_chunk_rows``), at least one."""
        rows = self._score_bytes // max(1, queries * shard.element_size())
        if shard.device.type == "cpu":
            rows = min(rows, self._chunk)
        return max(1, min(rows, shard.shape[0]))

    @torch.inference_mode()
    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query, best first; equal scores by lower id (``index.topk``: any split gives the same)."""
        k = min(k, self._n)
        copy = self._prefilter  # read once: another thread may turn the pre-scan off meanwhile
        if copy is not None and k > 0 and len(queries):  # an empty batch: the scan gives its empty answer
            return self._search_prefiltered(copy, queries, k)
        return self._scan(queries, k)

    def _search_prefiltered(self, copy: CoarseCopy, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The coarse pre-scan (``index.prefilter``)."""
        shard = self._shards[0][1]
        step = self._rows_per_step(shard, len(queries))
        found = prefiltered_topk(queries, shard, copy, k, step, self._buffers.scores)
        s, i = found.scores.numpy(), found.ids.numpy().astype(np.int64)
        if found.rescan:  # crowded beyond what gathering rows is worth: the float32 scan's own answers
            s[found.rescan], i[found.rescan] = self._scan(queries[found.rescan], k)
        with self._count_lock:  # the per-request mode searches from many threads
            self.crowded_queries += found.crowded
            self._prefiltered_queries += len(queries)
            self._crowded_blocks += found.crowded_blocks
            self._scanned_blocks += found.blocks
        self._give_up_if_crowded()
        return s, i

    def _give_up_if_crowded(self) -> None:
        """Under 'auto', once :data:`CROWDED_TRIAL` queries are in: if more than :data:`CROWDED_GIVE_UP` of their
        (query, block) pairs crowded (an encoder whose scores sit closer than the copy can tell apart), search in
        float32 from then on and free the copy. Each crowded pair costs a pass over the query's scores of the block, a
        gather and a re-score, about what the float32 scan of the block costs the query; when most crowd, the
        pre-scan gains nothing (bf16 0.87-0.92x, int8 0.48-0.57x with every query crowded in its one block,
        `benchmarks/cpu_flat_scan.py --search --shared`). Queries crowded in a few blocks of many cost little (int8
        over 2M random rows: 95% of queries crowded, 1.87x the float32 scan), so queries alone are not counted."""
        with self._count_lock:
            if not self._prefilter_auto or self._prefilter is None or self._prefiltered_queries < CROWDED_TRIAL:
                return
            self._prefilter_auto = False  # decided once
            share = self._crowded_blocks / max(1, self._scanned_blocks)
            if share <= CROWDED_GIVE_UP:
                return
            name, self._prefilter = self._prefilter.name, None
        logger.warning(
            "%s pre-scan: %.0f%% of the first %d queries' blocks had more rows within its rounding margin than it "
            "keeps (their scores sit too close together for %s); searching in float32 from now on "
            "(--index_prefilter %s keeps the pre-scan)",
            name,
            100 * share,
            self._prefiltered_queries,
            name,
            name,
        )

    def _scan(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The flat scan of every shard in the index's dtype."""
        best_s: list[torch.Tensor] = []
        best_i: list[torch.Tensor] = []
        for offset, shard in self._shards:
            q = queries.to(device=shard.device, dtype=self.dtype)
            step = self._rows_per_step(shard, len(q))
            # a GPU selects from its steps of a million rows and more in two passes (grouped_topk: 1.5x one pass at 256
            # queries on an H200, benchmarks/gpu_search_path.py); on the CPU one pass over 2^18 rows is as fast
            select = grouped_topk if shard.device.type == "cuda" else block_topk
            for lo in range(0, shard.shape[0], step):
                rows = shard[lo : lo + step]
                if shard.device.type == "cpu":  # into this thread's buffer (a GPU's caching allocator reuses its own)
                    out = self._buffers.scores(len(q), len(rows), self.dtype)
                    scores = self.layout.product(len(q))(q, rows, out, self._scratch_for)
                else:
                    scores = q @ rows.T
                # top-k in the index's dtype (its matmul's own rounding), then only k scores per query made float32
                s, i = select(scores, k, offset + lo)
                best_s.append(s.float().cpu())
                best_i.append(i.cpu())
        if len(best_s) == 1:
            return best_s[0].numpy(), best_i[0].numpy().astype(np.int64)
        all_s, all_i = torch.cat(best_s, dim=1).numpy(), torch.cat(best_i, dim=1).numpy().astype(np.int64)
        return merge_topk(all_s, all_i, k)
