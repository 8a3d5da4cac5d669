"""Exact top-k with one tie rule: best score first, equal scores by lower id (so any split of an index merges back to
the same answer).

Invariant: ``block_topk`` over a block and ``merge_topk`` over any partition of the rows into blocks return the same
(scores, ids) as ``block_topk`` over all rows at once, ties included, whenever the per-row scores are the same.
"""

from __future__ import annotations

import numpy as np
import torch


def block_topk(scores: torch.Tensor, k: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of each row of ``scores`` (queries x rows of one block); ids are ``offset`` + column.

    ``torch.topk`` orders equal values arbitrarily and may keep any of them at the cut: rows whose k-th and (k+1)-th
    values are equal are re-selected exactly (rare; costs nothing on rows without a tie at the cut).
    """
    k = min(k, scores.shape[1])
    take = min(k + 1, scores.shape[1])
    s, i = torch.topk(scores, take, dim=1)
    if take > k:
        tied = (s[:, k - 1] == s[:, k]).nonzero().flatten().tolist()
        s, i = s[:, :k].clone(), i[:, :k].clone()
        for row in tied:
            cand = (scores[row] >= s[row, k - 1]).nonzero().flatten()  # ascending columns
            order = torch.sort(scores[row, cand], descending=True, stable=True).indices[:k]
            s[row], i[row] = scores[row, cand[order]], cand[order]
    by_id = torch.sort(i, dim=1).indices
    i, s = torch.gather(i, 1, by_id), torch.gather(s, 1, by_id)
    by_score = torch.sort(s, dim=1, descending=True, stable=True).indices
    return torch.gather(s, 1, by_score), torch.gather(i, 1, by_score) + offset


def merge_topk(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` per row of concatenated per-block results (n x sum of k_j), ordered by (score desc, id asc).

    Exact when each block contributed its own top-k under the same rule (``block_topk``)."""
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
