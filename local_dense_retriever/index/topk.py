"""Exact top-k with one tie rule: best score first, equal scores by lower id (so any split of an index merges back to
the same answer).

Invariant: ``block_topk`` over a block and ``merge_topk`` over any partition of the rows into blocks return the same
(scores, ids) as ``block_topk`` over all rows at once, ties included, whenever the per-row scores are the same;
``grouped_topk`` returns exactly what ``block_topk`` returns.
"""

from __future__ import annotations

import numpy as np
import torch

#: the most memory the exact re-selection of tied rows may take at once (8 bytes per score of the rows in one go)
TIE_KEY_BYTES = 256 << 20


def exact_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Columns of the top ``k`` of each row by (score descending, column ascending), in that order, in one selection.

    Each score becomes a unique int64 key: its float32 bits made order-preserving (negative floats' magnitude bits
    flipped; -0.0 folded onto 0.0 first) above the column's complement, so a larger key is a better (score, column).
    """
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0: equal scores, equal bits
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    n = scores.shape[1]
    last = torch.arange(n - 1, -1, -1, device=scores.device, dtype=torch.int64)  # n - 1 - column: lower column wins
    return torch.topk(bits * (1 << 32) + last, k, dim=1).indices


def block_topk(scores: torch.Tensor, k: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of each row of ``scores`` (queries x rows of one block); ids are ``offset`` + column.

    ``torch.topk`` orders equal values arbitrarily and may keep any of them at the cut: rows whose k-th and (k+1)-th
    values are equal are re-selected exactly, all at once (``exact_topk``: common in half precision, where a GPU
    scan of a large batch finds such a tie in a few percent of its rows at every step).
    """
    k = min(k, scores.shape[1])
    take = min(k + 1, scores.shape[1])
    s, i = torch.topk(scores, take, dim=1)
    if take > k:
        tied = (s[:, k - 1] == s[:, k]).nonzero().flatten()
        s, i = s[:, :k].clone(), i[:, :k].clone()
        per_pass = max(1, TIE_KEY_BYTES // (8 * scores.shape[1]))
        for lo in range(0, len(tied), per_pass):
            rows = tied[lo : lo + per_pass]
            cols = exact_topk(scores[rows], k)
            i[rows], s[rows] = cols, torch.gather(scores[rows], 1, cols)
    s, i = ranked(s, i)
    return s, i + offset


def ranked(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (scores, ids) reordered by score descending, equal scores by lower id."""
    by_id = torch.sort(ids, dim=1).indices
    ids, scores = torch.gather(ids, 1, by_id), torch.gather(scores, 1, by_id)
    by_score = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return torch.gather(scores, 1, by_score), torch.gather(ids, 1, by_score)


def merge_topk(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` per row of concatenated per-block results (n x sum of k_j), ordered by (score desc, id asc).

    Exact when each block contributed its own top-k under the same rule (``block_topk``)."""
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


#: columns per group in ``grouped_topk``'s first pass
GROUP = 256


def best_groups(scores: torch.Tensor, count: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``(maxima, groups)``: per row of ``scores``, the ``count + 1`` highest maxima of its full groups of ``group``
    columns (best first) and those groups' indices: the first ``count`` are the groups to keep, the last bounds every
    score of the groups left out. One reduction over the scores and a top-k over ``n // group`` maxima."""
    n_rows, n = scores.shape
    n_groups = n // group
    maxima = scores[:, : n_groups * group].reshape(n_rows, n_groups, group).amax(dim=2)
    return torch.topk(maxima, count + 1, dim=1)


def grouped_topk(
    scores: torch.Tensor, k: int, offset: int = 0, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_topk(scores, k, offset)``, exactly, in two cheap passes instead of one selection over every column.

    The columns are cut into groups of ``group``; the best ``k`` groups by their maximum hold the top ``k`` scores
    unless the best group left out reaches the ``k``-th score found. So: one max per group (a reduction, as fast as
    reading the scores), a top-``k + 1`` over the group maxima, an exact ``block_topk`` over the ``k`` groups' columns
    (kept in column order, so the tie rule still sees ids in order), and ``block_topk`` over the whole row for the rows
    whose best left-out group ties or beats their ``k``-th score (rare: an exact tie at the cut).
    """
    n_rows, n = scores.shape
    k = min(k, n)
    n_groups = n // group
    if n_groups <= k + 1 or k == 0:
        return block_topk(scores, k, offset)
    main = n_groups * group
    best_max, best_group = best_groups(scores, k, group)
    cols = (best_group[:, :k, None] * group + torch.arange(group, device=scores.device)).reshape(n_rows, k * group)
    if main < n:  # the last, partial group is always a candidate
        cols = torch.cat([cols, torch.arange(main, n, device=scores.device).expand(n_rows, -1)], dim=1)
    cols = torch.sort(cols, dim=1).values  # candidates in id order: block_topk breaks ties by position
    s, at = block_topk(torch.gather(scores, 1, cols), k)
    i = torch.gather(cols, 1, at)
    unsure = (best_max[:, k] >= s[:, k - 1]).nonzero().flatten()
    if len(unsure):
        s[unsure], i[unsure] = block_topk(scores[unsure], k)
    return s, i + offset
