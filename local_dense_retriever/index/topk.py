"""Exact top-k with one tie rule: best score first, equal scores by lower id. Invariant: any partition of the rows,
merged (``merge_topk``), and ``grouped_topk`` return what ``block_topk`` over all rows returns, ties included."""

from __future__ import annotations

import numpy as np
import torch

#: the most memory the exact re-selection of tied rows may take at once (8 bytes per score of the rows in one go)
TIE_KEY_BYTES = 256 << 20


def exact_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Columns of the top ``k`` of each row by (score desc, column asc), in one selection over unique int64 keys: the
    score's float32 bits made order-preserving, above the column's complement."""
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0: equal scores, equal bits
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    n = scores.shape[1]
    last = torch.arange(n - 1, -1, -1, device=scores.device, dtype=torch.int64)  # n - 1 - column: lower column wins
    return torch.topk(bits * (1 << 32) + last, k, dim=1).indices


def block_topk(scores: torch.Tensor, k: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of each row of ``scores``; ids are ``offset`` + column. ``torch.topk`` may keep any of equal values
    at the cut, so rows tied at the cut (common in half precision) are re-selected exactly."""
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
    """Top-``k`` per row of concatenated per-block top-k lists, by (score desc, id asc)."""
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


#: columns per group in ``grouped_topk``'s first pass
GROUP = 256


def best_groups(scores: torch.Tensor, count: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``(maxima, groups)``: per row, its ``count + 1`` best group maxima and their groups, best first."""
    n_rows, n = scores.shape
    n_groups = n // group
    maxima = scores[:, : n_groups * group].reshape(n_rows, n_groups, group).amax(dim=2)
    return torch.topk(maxima, count + 1, dim=1)


def grouped_topk(
    scores: torch.Tensor, k: int, offset: int = 0, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_topk(scores, k, offset)``, exactly, in two cheap passes: the best ``k`` groups by their maximum hold
    the top ``k`` unless the best group left out reaches the ``k``-th score found (then that row is selected whole)."""
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
