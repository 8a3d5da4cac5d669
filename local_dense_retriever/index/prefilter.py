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

from dataclasses import dataclass

import torch

from local_dense_retriever.index.coarse_copy import (  # the copies: imported from here too
    Bf16Copy,
    CoarseCopy,
    Int8Copy,
    ScoresOut,
    score_bounds,
)
from local_dense_retriever.index.topk import GROUP, best_groups, block_topk

__all__ = ["EXTRA_ROWS", "Bf16Copy", "CoarseCopy", "Int8Copy", "Prescanned", "kept_rows", "prefiltered_topk",
           "score_bounds"]  # fmt: skip

#: the rows within its margin a crowded query gathers at most; beyond them it is scanned again in float32 (with
#: a thousand rows or more within the margin, the gather and re-score cost more than that scan)
CROWDED_ROWS = 1024
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
