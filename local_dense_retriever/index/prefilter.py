"""A coarse pre-scan (bfloat16 or int8) that finds every row that can be in a query's float32 top-k; only those are
scored in float32.

A bfloat16 matmul is 3-4x faster than a float32 one on a CPU with AMX, an int8 matmul (int32 sums) about 3x on one
with VNNI or AMX, but their scores are rounded: ranked by them alone, near-ties can swap. Here the rounding is bounded
instead (:meth:`Bf16Copy.bounds`, :meth:`Int8Copy.bounds`): the pre-scan keeps, in every block of rows, ``k + extra``
of the best coarse scores of each query (:func:`kept_rows`), and a row can be in the float32 top-k only if its coarse
score is within twice the error of the k-th best coarse score. If every score a block left out is below that margin,
the kept rows hold the whole top-k; the rows among them within the margin are scored in float32, which gives the flat
scan's answer. For a query for which a block left out a score within the margin ("crowded": scores packed more
tightly than the copy can tell apart), every row of the block within it is taken from the block's scores while they
are at hand, and scored in float32 too: nothing is scanned twice.

Invariant: for every query, the ids returned are the float32 flat scan's top-k (best score first, equal scores by lower
id) up to float32 rounding, the same exactness as the float32 scan itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from local_dense_retriever.index.topk import GROUP, best_groups, block_topk

#: unit roundoff of bfloat16 (8 significant bits, round to nearest even) and of float32 (24 bits)
BF16_ROUNDOFF = 2.0**-8
FP32_ROUNDOFF = 2.0**-24
#: an int8 copy's values: symmetric, so that -128 (which has no positive twin) never appears
INT8_LEVELS = 127
#: the rows within its margin a crowded query gathers at most; beyond them it is scanned again in float32 (with
#: a thousand rows or more within the margin, the gather and re-score cost more than that scan)
CROWDED_ROWS = 1024
#: the float64 rows an int8 copy is checked in at a time (the residuals' norms): a few such temporaries per step
INT8_STEP_BYTES = 8 << 20
#: rows kept per query and block beyond k: a query is crowded when more than this many rows crowd its k-th score
EXTRA_ROWS = 64

#: ``scores_out(queries, rows, dtype)``: the buffer a step's matmul writes into
ScoresOut = Callable[[int, int, torch.dtype], torch.Tensor]


class CoarseCopy(Protocol):
    """A float32 index's rows in a coarser dtype, whose scores' error against float32's is bounded."""

    name: str
    dtype: torch.dtype
    rows: torch.Tensor
    #: groups of columns (``index.topk.GROUP``) whose rows are kept per query and block beyond k: their maxima must
    #: reach below the margin too (each copy's choice is measured where it is set)
    extra_groups: int

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(coarse queries, unit)``: the queries (float32) in the copy's dtype, and per query the float64 ``unit``
        that turns its coarse scores into scores (``q . x ~ unit * coarse score``)."""
        ...

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        """The coarse scores of ``coarse`` (from :meth:`prepared`) against rows ``[lo, hi)``."""
        ...

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """Per query (float32 rows of ``queries``) a bound ``e`` (float64) such that, for every row ``x`` of the
        index, the pre-scan's score ``t`` (coarse score times unit, as compared) and the float32 re-score ``s'`` of
        ``q . x`` satisfy ``|t - q.x| + |s' - q.x| <= e``."""
        ...


def _slack(dim: int) -> float:
    """How much a norm computed in float32 over ``dim`` terms may be raised to stay an upper bound."""
    return 1 + 2 * (dim + 2) * FP32_ROUNDOFF


def _largest_norms(
    block: torch.Tensor, near: torch.Tensor, max_norm: float, max_residual: float
) -> tuple[float, float]:
    """``(max_norm, max_residual)`` raised to the largest norm of a row of ``near`` (``block``'s rows as the copy
    holds them) and of a row's residual ``block - near``, in their dtype."""
    norm = float(torch.linalg.vector_norm(near, dim=1).max())
    residual = float(torch.linalg.vector_norm(block - near, dim=1).max())
    return max(max_norm, norm), max(max_residual, residual)


def _fp32_sum_error(dim: int) -> float:
    """float32's relative error accumulated over a sum of ``dim`` products (``dim u / (1 - dim u)``)."""
    return dim * FP32_ROUNDOFF / (1 - dim * FP32_ROUNDOFF)


@dataclass(frozen=True)
class Bf16Copy:
    """A float32 index's rows in bfloat16, and the two numbers its scores' error is bounded by: the largest norm of a
    bf16 row and the largest norm of a row's rounding residual ``x - bf16(x)``. For CPUs with AMX (bf16 tiles)."""

    rows: torch.Tensor
    max_norm: float
    max_residual: float
    name = "bfloat16"
    dtype = torch.bfloat16
    #: rows within its margin in the 100k-passage MiniLM index: median 5, at most 21, none crowded; 64 groups made its
    #: scan 10% slower
    extra_groups = 32

    @classmethod
    def of(cls, vectors: torch.Tensor, rows_per_step: int) -> Bf16Copy:
        """The copy of ``vectors`` (float32), made ``rows_per_step`` rows at a time: no float32 copy of the whole
        index is ever made. The norms are computed in float32 and raised by its worst relative error over ``dim``
        terms (the residual ``x - bf16(x)`` itself is exact in float32: it is the low bits of ``x``)."""
        rows = torch.empty(vectors.shape, dtype=torch.bfloat16)
        max_norm = max_residual = 0.0
        for lo in range(0, len(vectors), rows_per_step):
            block = vectors[lo : lo + rows_per_step]
            rounded = rows[lo : lo + len(block)]
            rounded.copy_(block)
            max_norm, max_residual = _largest_norms(block, rounded.float(), max_norm, max_residual)
        slack = _slack(vectors.shape[1])
        return cls(rows, max_norm * slack, max_residual * slack)

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return queries.to(torch.bfloat16), torch.ones(len(queries), dtype=torch.float64)

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        rows = self.rows[lo:hi]
        return torch.matmul(coarse, rows.T, out=out(len(coarse), len(rows), torch.bfloat16))

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """With ``q_b``, ``x_b`` the bf16 roundings, ``N`` the largest ``|x_b|``, ``R`` the largest ``|x - x_b|``,
        ``u`` bf16's roundoff and ``g`` float32's accumulated over ``dim`` terms:

        - ``q . x - q_b . x_b = q . (x - x_b) + (q - q_b) . x_b``: at most ``|q| R + |q - q_b| N`` (Cauchy-Schwarz);
        - the products of bf16 numbers are exact in float32 (AMX and AVX512-BF16 multiply so); summing them in
          float32: ``g |q_b| N``;
        - the matmul writes bf16 scores (torch has no float32 output for bf16 inputs on the CPU): ``u (1 + g) |q_b|
          N``;
        - the float32 re-score ``s'``: ``g |q| (N + R)``;
        - denormals flushed to zero (inputs and products below 2^-126): ``dim 2^-126 (2 + |q_b| + N)``;
        - and float32's rounding of the threshold the bound is subtracted from: ``4 2^-24 (|q_b| N + |q| (N + R))``.
        """
        dim = queries.shape[1]
        u, g = BF16_ROUNDOFF, _fp32_sum_error(dim)
        q = queries.double()
        q_b = queries.to(torch.bfloat16).double()
        norm, norm_b = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(q_b, dim=1)
        residual = torch.linalg.vector_norm(q - q_b, dim=1)
        n, r = self.max_norm, self.max_residual
        e = norm * r + residual * n + (g + u * (1 + g)) * norm_b * n + g * norm * (n + r)
        e += dim * 2.0**-126 * (2 + norm_b + n) + 4 * FP32_ROUNDOFF * (norm_b * n + norm * (n + r))
        return e


@dataclass(frozen=True)
class Int8Copy:
    """A float32 index's rows as int8 multiples of one ``scale`` (one for the whole index, so that the int32 scores of
    a query are comparable across rows), the largest norm of a row so rounded (``scale * x_i``) and the largest norm
    of a row's rounding residual ``x - scale * x_i``. For CPUs with VNNI or AMX (int8 dot products, int32 sums):
    a quarter of the index's size."""

    rows: torch.Tensor
    scale: float
    max_norm: float
    max_residual: float
    name = "int8"
    dtype = torch.int8
    #: rows within its margin (MiniLM, 100k): median 15, at most 89. 64 groups crowd 1.0% of the MiniLM questions
    #: instead of 10.2% at 32, and 15% of the (query, block) pairs over 2M random rows instead of 40%, at the same
    #: speed; 96 crowd no fewer (``EXTRA_ROWS`` bounds them then). ``benchmarks/cpu_flat_scan.py --int8_groups``
    extra_groups = 64

    @classmethod
    def of(cls, vectors: torch.Tensor, rows_per_step: int) -> Int8Copy:
        """The copy of ``vectors`` (float32) in two passes of ``rows_per_step`` rows (the scale, then the rows): no
        float32 copy of the whole index is ever made. The norms are computed in float64 from the exact residuals, a
        step of at most :data:`INT8_STEP_BYTES` of them at a time."""
        rows_per_step = max(1, min(rows_per_step, INT8_STEP_BYTES // (8 * vectors.shape[1])))
        largest = 0.0
        for lo in range(0, len(vectors), rows_per_step):
            largest = max(largest, float(vectors[lo : lo + rows_per_step].abs().max()))
        scale = largest / INT8_LEVELS if largest > 0 else 1.0
        rows = torch.empty(vectors.shape, dtype=torch.int8)
        max_norm = max_residual = 0.0
        for lo in range(0, len(vectors), rows_per_step):
            block = vectors[lo : lo + rows_per_step]
            rounded = _quantised(block, torch.tensor([[scale]]))
            rows[lo : lo + len(block)] = rounded
            near = rounded.double() * scale  # exact: an int of 8 bits times a float32
            max_norm, max_residual = _largest_norms(block.double(), near, max_norm, max_residual)
        return cls(rows, scale, max_norm * (1 + 2.0**-40), max_residual * (1 + 2.0**-40))

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step = _query_steps(queries)
        return _quantised(queries, step), step.double().flatten() * self.scale

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        rows = self.rows[lo:hi]
        return torch._int_mm(coarse, rows.T, out=out(len(coarse), len(rows), torch.int32))

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """With ``t q_i`` the query so rounded (``t`` its own step), ``N`` the largest ``|s x_i|``, ``R`` the largest
        ``|x - s x_i|`` and ``g`` float32's error accumulated over ``dim`` terms:

        - ``q . x - t s (q_i . x_i) = q . (x - s x_i) + (q - t q_i) . s x_i``: at most ``|q| R + |q - t q_i| N``;
        - the int32 sums are exact (``127^2 dim < 2^31``), but they are compared in float32 (rounded beyond 2^24):
          ``2^-24 |t q_i| N``;
        - the float32 re-score ``s'``: ``g |q| (N + R)``, and its denormals, ``dim 2^-126 (2 + |q| + N)``;
        - and float32's rounding of the threshold the bound is subtracted from: ``4 2^-24 (|t q_i| N + |q| (N +
          R))``.
        """
        dim = queries.shape[1]
        if INT8_LEVELS**2 * dim >= 2**31:
            raise ValueError(f"an int8 pre-scan's int32 sums overflow beyond {2**31 // INT8_LEVELS**2 - 1} dims")
        g = _fp32_sum_error(dim)
        step = _query_steps(queries)
        q = queries.double()
        q_i = _quantised(queries, step).double() * step.double()
        norm, norm_i = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(q_i, dim=1)
        residual = torch.linalg.vector_norm(q - q_i, dim=1)
        n, r = self.max_norm, self.max_residual
        e = norm * r + residual * n + FP32_ROUNDOFF * norm_i * n + g * norm * (n + r)
        e += dim * 2.0**-126 * (2 + norm + n) + 4 * FP32_ROUNDOFF * (norm_i * n + norm * (n + r))
        return e * (1 + 2.0**-40)


def _query_steps(queries: torch.Tensor) -> torch.Tensor:
    """Per query (a column), the step of its int8 rounding: its largest coordinate is 127 steps (1 for a zero
    query)."""
    largest = queries.abs().amax(dim=1, keepdim=True)
    return torch.where(largest > 0, largest / INT8_LEVELS, torch.ones_like(largest))


def _quantised(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) in int8 multiples of ``step`` (broadcast over rows), rounded to nearest, within +-127."""
    return torch.round(x / step).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)


def score_bounds(queries: torch.Tensor, copy: CoarseCopy) -> torch.Tensor:
    """``copy``'s bound on the pre-scan's and the float32 re-score's error together, per query (float64)."""
    return copy.bounds(queries)


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
