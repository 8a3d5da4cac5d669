"""The pre-scan (:class:`Prescan`, a ``ShardScan``): a coarse copy of a float32 CPU shard (bfloat16 or int8) scanned
first, to find every row that can be in a query's float32 top-k; only those are scored in float32. The copy is half
(bf16) or a quarter (int8) of the float32 rows, so a scan reads that much less memory.

Its scores are rounded: ranked by them alone, near-ties could swap. Here the rounding is bounded instead
(:meth:`Bf16Copy.bounds`, :meth:`Int8Copy.bounds`): the pre-scan keeps, in every block of rows, ``k + extra`` of the
best coarse scores of each query (:func:`kept_rows`), and a row can be in the float32 top-k only if its coarse score
is within twice the error of the k-th best coarse score. If every score a block left out is below that margin,
the kept rows hold the whole top-k; the rows among them within the margin are scored in float32, which gives the flat
scan's answer. For a query for which a block left out a score within the margin ("crowded": scores packed more
tightly than the copy can tell apart), every row of the block within it is taken from the block's scores while they
are at hand, and scored in float32 too: nothing is scanned twice.

Invariant: for every query, the ids returned are the float32 flat scan's top-k (best score first, equal scores by lower
id) up to float32 rounding, the same exactness as the float32 scan itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import partial

import torch

from local_dense_retriever.accel.coarse_copy import CoarseCopy, ScoresOut
from local_dense_retriever.index.flat_file import STAGING_BYTES
from local_dense_retriever.index.scan import ExactScan, RowsRead, ScanWrapper
from local_dense_retriever.index.topk import GROUP, best_groups, block_topk
from local_dense_retriever.load_progress import LoadProgress

logger = logging.getLogger(__name__)

#: the rows within its margin a crowded query gathers at most; beyond them it is scanned again in float32 (with
#: a thousand rows or more within the margin, the gather and re-score cost more than that scan)
CROWDED_ROWS = 1024
#: under 'auto' the pre-scan is given up when more than this share of the (query, block) pairs of its first
#: :data:`CROWDED_TRIAL` queries crowd: each such pair costs about a float32 scan of the block for the query
CROWDED_GIVE_UP = 0.5
CROWDED_TRIAL = 1024
#: rows kept per query and block beyond k: a query is crowded when more than this many rows crowd its k-th score
EXTRA_ROWS = 64


def kept_rows(
    scores: torch.Tensor, keep: int, groups: int, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scores, columns, floor)``: ``keep`` of the best scores of each row of ``scores`` (queries x columns of one
    block) and their columns, and per row a ``floor`` no score left out exceeds (-inf when none is left out).

    Not a full top-k over every column (in bf16 that took as long as the matmul): the columns are cut into groups of
    ``group``, the ``groups`` groups with the highest maxima are kept (a max per group is one pass over the scores),
    and the top ``keep`` of their columns taken. A score left out is at most the best maximum of the groups left out or
    the lowest score kept: the floor is the larger of the two. A last, partial group is a block of its own.
    """
    n_rows, n = scores.shape
    if n <= keep:
        return scores.float(), torch.arange(n).expand(n_rows, n), torch.full((n_rows,), -torch.inf)
    n_groups = n // group
    if n_groups <= groups + 1 or groups * group < keep:
        s, i = torch.topk(scores, keep, dim=1)
        s = s.float()
        return s, i, s[:, -1]
    main = n_groups * group
    best_max, best_group = best_groups(scores, groups, group)
    grouped = scores[:, :main].view(n_rows, n_groups, group)
    picked = torch.gather(grouped, 1, best_group[:, :groups, None].expand(n_rows, groups, group))
    s, at = torch.topk(picked.view(n_rows, groups * group), keep, dim=1)
    s = s.float()
    columns = torch.gather(best_group, 1, at // group) * group + at % group
    floor = torch.maximum(s[:, -1], best_max[:, groups].float())
    if main < n:
        tail_s, tail_i, tail_floor = kept_rows(scores[:, main:], keep, groups, group)
        s, columns = torch.cat([s, tail_s], dim=1), torch.cat([columns, tail_i + main], dim=1)
        floor = torch.maximum(floor, tail_floor)
    return s, columns, floor


@dataclass
class Prescanned:
    """What :func:`prefiltered_topk` found: the float32 top-k of each query (``scores``, ``ids``; the rows of
    ``rescan`` are placeholders), how many queries were ``crowded``, and ``rescan``: the crowded queries with more
    than :data:`CROWDED_ROWS` rows within their margin, which the caller scans in float32 instead.

    What the crowding cost: ``crowded_blocks`` of the ``blocks`` (query, block) pairs scanned were crowded (a
    rescanned query counts every block). Each costs about what the float32 scan of that block costs that query (a
    pass over its scores, a gather and a re-score), so the pre-scan pays only while this share stays well below 1."""

    scores: torch.Tensor
    ids: torch.Tensor
    crowded: int
    rescan: list[int]
    crowded_blocks: int
    blocks: int


def prefiltered_topk(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    copy: CoarseCopy,
    k: int,
    rows_per_step: int,
    scores_out: ScoresOut,
    extra: int = EXTRA_ROWS,
) -> Prescanned:
    """The float32 top-``k`` of each query over ``vectors`` (float32, ``copy`` its coarse twin), found through the
    pre-scan. A crowded query (a block left out a row within its margin) gets every such row of the block from its
    scores while they are at hand, so it is not scanned twice, up to :data:`CROWDED_ROWS` rows in all; beyond that,
    gathering and re-scoring would cost more than a float32 scan of it, and it is left to the caller
    (:attr:`Prescanned.rescan`). ``scores_out(queries, rows, dtype)`` gives the buffer each step's matmul writes into;
    ids are rows of ``vectors``. Scores below are in each query's coarse units until the float32 re-score."""
    n, dim = vectors.shape
    q32 = queries.float()
    coarse, unit = copy.prepared(q32)
    margin = 2 * copy.bounds(q32) / unit
    kept_s: list[torch.Tensor] = []
    kept_i: list[torch.Tensor] = []
    #: crowded query -> (coarse scores, ids) of every row a block left out within the threshold known then
    more: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    gathered: dict[int, int] = {}
    crowded_blocks: dict[int, int] = {}
    rescan: set[int] = set()
    for lo in range(0, n, rows_per_step):
        scores = copy.scores(coarse, lo, min(n, lo + rows_per_step), scores_out)
        s, i, floor = kept_rows(scores, k + extra, k + copy.extra_groups)
        kept_s.append(s)
        kept_i.append(i + lo)
        # the k-th score kept so far is at most the final one: its threshold takes in every row the final one does
        # (after the last block, it is the final one)
        coarse_s = torch.cat(kept_s, dim=1)
        threshold = _threshold(coarse_s, k, margin)
        for q in ((floor >= threshold) & (floor > -torch.inf)).nonzero().flatten().tolist():
            if q in rescan:
                continue
            crowded_blocks[q] = crowded_blocks.get(q, 0) + 1
            cols = (scores[q] >= threshold[q]).nonzero().flatten()
            gathered[q] = gathered.get(q, 0) + len(cols)
            if gathered[q] > CROWDED_ROWS:
                rescan.add(q)
                more.pop(q, None)
                continue
            more.setdefault(q, []).append((scores[q, cols].float(), cols + lo))
    ids = torch.cat(kept_i, dim=1)
    # only rows within the margin can be in the top k: as many per query as the query with the most has
    width = max(k, int((coarse_s >= threshold[:, None]).sum(dim=1).max()))
    candidates = torch.sort(torch.gather(ids, 1, torch.topk(coarse_s, width, dim=1).indices), dim=1).values
    s, i = _rescored(q32, vectors, candidates, k)
    for q, parts in more.items():
        near = torch.cat([coarse_s[q], *(p[0] for p in parts)])
        rows = torch.cat([ids[q], *(p[1] for p in parts)])[near >= threshold[q]]
        s[q], i[q] = (t[0] for t in _rescored(q32[q : q + 1], vectors, torch.unique(rows)[None], k))
    blocks = -(-n // rows_per_step)
    cost = sum(blocks if q in rescan else c for q, c in crowded_blocks.items())
    return Prescanned(s, i, len(gathered), sorted(rescan), cost, blocks * len(queries))


def _threshold(coarse_scores: torch.Tensor, k: int, margin: torch.Tensor) -> torch.Tensor:
    """Per query, the lowest coarse score a row of the float32 top ``k`` can have: the ``k``-th best of
    ``coarse_scores`` less ``margin`` (-inf while fewer than ``k`` are known)."""
    if coarse_scores.shape[1] < k:
        return torch.full((len(coarse_scores),), -torch.inf)
    kth = torch.topk(coarse_scores, k, dim=1).values[:, -1]
    return (kth.double() - margin).float()


def _rescored(queries: torch.Tensor, vectors: torch.Tensor, ids: torch.Tensor, k: int):
    """The float32 top-``k`` of each query over its candidate rows ``ids`` (ascending per query: ``block_topk``
    breaks ties by position, so equal scores come by lower id)."""
    rows = vectors.index_select(0, ids.flatten()).view(*ids.shape, vectors.shape[1])
    # one reduction per row, the same for every row: a matrix-vector kernel sums tail rows in another order, so
    # duplicate passages would differ in their last bit and lose the tie rule
    exact = (rows * queries[:, None, :]).sum(dim=2)
    s, at = block_topk(exact, k)
    return s, torch.gather(ids, 1, at)


class Prescan:
    """The pre-scan of one float32 CPU shard in ``copy_type``'s copy; its exact scan answers what the copy cannot
    (queries crowded past :data:`CROWDED_ROWS`, an empty batch) and everything once an ``auto`` pre-scan gave up."""

    def __init__(
        self,
        exact: ExactScan,
        rows_read: RowsRead,
        progress: LoadProgress | None = None,
        *,
        copy_type: type[CoarseCopy],
        auto: bool = False,
        step_bytes: int = STAGING_BYTES,
    ) -> None:
        """The copy is made ``step_bytes`` of float32 rows at a time, ``rows_read`` and ``progress`` told after each
        step; ``auto``: give up where most queries crowd."""
        self.exact = exact
        rows, dim = exact.rows.shape
        if progress is not None:
            progress.expect(copy_type.passes * rows * dim * 4)

        def read(lo: int, hi: int) -> None:
            rows_read(lo, hi)
            if progress is not None:
                progress.add((hi - lo) * dim * 4)

        self.copy: CoarseCopy | None = copy_type.of(exact.rows, max(1, step_bytes // (dim * 4)), read)
        self.name = copy_type.name
        self.auto = auto
        self.crowded_queries = 0
        self._queries = self._blocks = self._crowded_blocks = 0
        self._lock = threading.Lock()  # the per-request mode searches from many threads

    @classmethod
    def wrapper(
        cls, copy_type: type[CoarseCopy], *, auto: bool = False, step_bytes: int = STAGING_BYTES
    ) -> ScanWrapper:
        """What ``TorchFlatIndex(cpu_scan=...)`` takes to pre-scan its CPU shard in ``copy_type``'s copy."""
        return partial(cls, copy_type=copy_type, auto=auto, step_bytes=step_bytes)

    def describe(self) -> str:
        return f"{self.name} pre-scan" if self.copy is not None else "exact scan"

    def topk(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        copy = self.copy  # read once: another thread may give the pre-scan up meanwhile
        if copy is None or k == 0 or not len(queries):
            return self.exact.topk(queries, k)
        step = self.exact.rows_per_step(len(queries))
        found = prefiltered_topk(queries, self.exact.rows, copy, k, step, self.exact.buffers.scores)
        s, i = found.scores, found.ids
        if found.rescan:  # crowded beyond what gathering rows is worth: the float32 scan's own answers
            s[found.rescan], i[found.rescan] = self.exact.topk(queries[found.rescan], k)
        with self._lock:
            self.crowded_queries += found.crowded
            self._queries += len(queries)
            self._crowded_blocks += found.crowded_blocks
            self._blocks += found.blocks
        self._give_up_if_crowded()
        return s, i.to(torch.int64)

    def _give_up_if_crowded(self) -> None:
        """Under 'auto', once :data:`CROWDED_TRIAL` queries are in: if more than :data:`CROWDED_GIVE_UP` of their
        (query, block) pairs crowded (an encoder whose scores sit closer than the copy can tell apart), scan in
        float32 from then on and free the copy."""
        with self._lock:
            if not self.auto or self.copy is None or self._queries < CROWDED_TRIAL:
                return
            self.auto = False  # decided once
            share = self._crowded_blocks / max(1, self._blocks)
            if share <= CROWDED_GIVE_UP:
                return
            self.copy = None
        logger.warning(
            "%s pre-scan: %.0f%% of the first %d queries' blocks had more rows within its rounding margin than it "
            "keeps (their scores sit too close together for %s); searching in float32 from now on "
            "(--index_prefilter %s keeps the pre-scan)", self.name, 100 * share, self._queries, self.name, self.name,
        )  # fmt: skip
