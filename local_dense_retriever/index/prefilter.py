"""A bfloat16 pre-scan that finds every row that can be in a query's float32 top-k; only those are scored in float32.

On a CPU with AMX a bfloat16 matmul is 3-4x faster than a float32 one, but its scores are rounded: ranked by them
alone, near-ties can swap. Here the rounding is bounded instead (:func:`score_bounds`): the pre-scan keeps, in every
block of rows, ``k + extra`` of the best bf16 scores of each query (:func:`kept_rows`), and a row can be in the float32
top-k only if its bf16 score is within twice the error of the k-th best bf16 score. If every score a block left out is
below that margin, the kept rows hold the whole top-k; the rows among them within the margin are scored in float32,
which gives the flat scan's answer. For a query for which a block left out a score within the margin ("crowded":
scores packed more tightly than bf16 can tell apart), every row of the block within it is taken from the block's
scores while they are at hand, and scored in float32 too: nothing is scanned twice.

Invariant: for every query, the ids returned are the float32 flat scan's top-k (best score first, equal scores by lower
id) up to float32 rounding, the same exactness as the float32 scan itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_dense_retriever.index.topk import GROUP, block_topk

#: unit roundoff of bfloat16 (8 significant bits, round to nearest even) and of float32 (24 bits)
BF16_ROUNDOFF = 2.0**-8
FP32_ROUNDOFF = 2.0**-24
#: rows kept per query and block beyond k: a query is crowded when more than this many rows crowd its k-th score
EXTRA_ROWS = 64
#: groups of columns (``index.topk.GROUP``) whose rows are kept per query and block beyond k: their maxima must
#: reach below the margin too (the rows within it in a 100k-passage MiniLM index: median 7, at most 28)
EXTRA_GROUPS = 32


@dataclass(frozen=True)
class Bf16Copy:
    """A float32 index's rows in bfloat16, and the two numbers its scores' error is bounded by: the largest norm of a
    bf16 row and the largest norm of a row's rounding residual ``x - bf16(x)``."""

    rows: torch.Tensor
    max_norm: float
    max_residual: float

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
            near = rounded.float()
            max_norm = max(max_norm, float(torch.linalg.vector_norm(near, dim=1).max()))
            max_residual = max(max_residual, float(torch.linalg.vector_norm(block - near, dim=1).max()))
        slack = 1 + 2 * (vectors.shape[1] + 2) * FP32_ROUNDOFF
        return cls(rows, max_norm * slack, max_residual * slack)


def score_bounds(queries: torch.Tensor, copy: Bf16Copy) -> torch.Tensor:
    """Per query (float32 rows of ``queries``) a bound ``e`` (float64) such that, for every row ``x`` of the index,
    the pre-scan's bf16 score ``t`` and the float32 re-score ``s'`` of ``q . x`` satisfy ``|t - q.x| + |s' - q.x| <=
    e``. With ``q_b``, ``x_b`` the bf16 roundings, ``N`` the largest ``|x_b|``, ``R`` the largest ``|x - x_b|``, ``u``
    bf16's roundoff and ``g`` float32's accumulated over ``dim`` terms (``dim * 2^-24 / (1 - dim * 2^-24)``):

    - ``q . x - q_b . x_b = q . (x - x_b) + (q - q_b) . x_b``: at most ``|q| R + |q - q_b| N`` (Cauchy-Schwarz);
    - the products of bf16 numbers are exact in float32 (AMX and AVX512-BF16 multiply so); summing them in float32:
      ``g |q_b| N``;
    - the matmul writes bf16 scores (torch has no float32 output for bf16 inputs on the CPU): ``u (1 + g) |q_b| N``;
    - the float32 re-score ``s'``: ``g |q| (N + R)``;
    - denormals flushed to zero (inputs and products below 2^-126): ``dim 2^-126 (2 + |q_b| + N)``;
    - and float32's rounding of the threshold the bound is subtracted from: ``4 2^-24 (|q_b| N + |q| (N + R))``.
    """
    dim = queries.shape[1]
    u, g = BF16_ROUNDOFF, dim * FP32_ROUNDOFF / (1 - dim * FP32_ROUNDOFF)
    q = queries.double()
    q_b = queries.to(torch.bfloat16).double()
    norm, norm_b = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(q_b, dim=1)
    residual = torch.linalg.vector_norm(q - q_b, dim=1)
    n, r = copy.max_norm, copy.max_residual
    e = norm * r + residual * n + (g + u * (1 + g)) * norm_b * n + g * norm * (n + r)
    e += dim * 2.0**-126 * (2 + norm_b + n) + 4 * FP32_ROUNDOFF * (norm_b * n + norm * (n + r))
    return e


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
    grouped = scores[:, :main].view(n_rows, n_groups, group)
    best_max, best_group = torch.topk(grouped.amax(dim=2), groups + 1, dim=1)
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


def prefiltered_topk(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    copy: Bf16Copy,
    k: int,
    rows_per_step: int,
    scores_out,
    extra: int = EXTRA_ROWS,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scores, ids, crowded)``: the float32 top-``k`` of each query over ``vectors`` (float32, ``copy`` its bf16
    twin), found through the bf16 pre-scan, and how many queries were crowded (a block left out a row within their
    margin: every such row of the block is taken from its scores while they are at hand, so no query is scanned
    twice). ``scores_out(queries, rows, dtype)`` gives the buffer each step's matmul writes into; ids are rows of
    ``vectors``."""
    n, dim = vectors.shape
    q32 = queries.float()
    q16 = q32.to(torch.bfloat16)
    margin = 2 * score_bounds(q32, copy)
    kept_s: list[torch.Tensor] = []
    kept_i: list[torch.Tensor] = []
    #: crowded query -> (bf16 scores, ids) of every row a block left out within the threshold known then
    more: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for lo in range(0, n, rows_per_step):
        rows = copy.rows[lo : lo + rows_per_step]
        scores = torch.matmul(q16, rows.T, out=scores_out(len(q16), len(rows), torch.bfloat16))
        s, i, floor = kept_rows(scores, k + extra, k + EXTRA_GROUPS)
        kept_s.append(s)
        kept_i.append(i + lo)
        # the k-th score kept so far is at most the final one: its threshold takes in every row the final one does
        # (after the last block, it is the final one)
        bf16_s = torch.cat(kept_s, dim=1)
        threshold = _threshold(bf16_s, k, margin)
        for q in ((floor >= threshold) & (floor > -torch.inf)).nonzero().flatten().tolist():
            cols = (scores[q] >= threshold[q]).nonzero().flatten()
            more.setdefault(q, []).append((scores[q, cols].float(), cols + lo))
    ids = torch.cat(kept_i, dim=1)
    # only rows within the margin can be in the top k: as many per query as the query with the most has
    width = max(k, int((bf16_s >= threshold[:, None]).sum(dim=1).max()))
    candidates = torch.sort(torch.gather(ids, 1, torch.topk(bf16_s, width, dim=1).indices), dim=1).values
    s, i = _rescored(q32, vectors, candidates, k)
    for q, parts in more.items():
        near = torch.cat([bf16_s[q], *(p[0] for p in parts)])
        rows = torch.cat([ids[q], *(p[1] for p in parts)])[near >= threshold[q]]
        s[q], i[q] = (t[0] for t in _rescored(q32[q : q + 1], vectors, torch.unique(rows)[None], k))
    return s, i, len(more)


def _threshold(bf16_scores: torch.Tensor, k: int, margin: torch.Tensor) -> torch.Tensor:
    """Per query, the lowest bf16 score a row of the float32 top ``k`` can have: the ``k``-th best of
    ``bf16_scores`` less ``margin`` (-inf while fewer than ``k`` are known)."""
    if bf16_scores.shape[1] < k:
        return torch.full((len(bf16_scores),), -torch.inf)
    kth = torch.topk(bf16_scores, k, dim=1).values[:, -1]
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
