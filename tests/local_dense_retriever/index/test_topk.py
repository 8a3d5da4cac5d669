"""Exact top-k under the one tie rule (best score first, equal scores by lower id): the one-pass selection and the
grouped two-pass one that large scans use give the brute-force answer, ties at the cut included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from local_dense_retriever.index.topk import block_topk, exact_topk, grouped_topk


def brute_force(scores: torch.Tensor, k: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    s = scores.float().numpy()
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, 1), order + offset


def _case(rng: np.random.Generator, rows: int, cols: int, levels: int | None, dtype: torch.dtype) -> torch.Tensor:
    if levels is None:  # continuous scores: ties only where the dtype's rounding makes them
        x = rng.standard_normal((rows, cols)).astype(np.float32)
    else:  # a few distinct values: ties at the cut in almost every row
        x = rng.integers(0, levels, (rows, cols)).astype(np.float32)
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("cols", "k", "group", "levels"),
    [
        (10_000, 3, 64, None),  # the usual case: a long row, small k
        (10_000, 10, 64, 50),  # ties at the cut in most rows
        (1_000, 5, 7, 3),  # three values: ties everywhere, a partial last group
        (64 * 12 + 5, 10, 64, None),  # barely enough groups, a partial last group
        (100, 8, 64, None),  # too few groups: one pass
        (5_000, 1, 16, None),
    ],
)
def test_grouped_topk_is_block_topk_is_brute_force(cols, k, group, levels, dtype):
    rng = np.random.default_rng(cols + k + group)
    scores = _case(rng, 37, cols, levels, dtype)
    want_s, want_i = brute_force(scores, k, 1000)
    for s, i in (block_topk(scores, k, 1000), grouped_topk(scores, k, 1000, group=group)):
        np.testing.assert_array_equal(i.numpy(), want_i)
        np.testing.assert_array_equal(s.float().numpy(), want_s)


def test_grouped_topk_when_the_best_scores_share_one_group():
    """All of a row's top k in one group, and a left-out group whose maximum equals the k-th score (a tie at the
    cut that only the fallback to the whole row resolves by id)."""
    scores = torch.zeros((2, 640))
    scores[:, 100:104] = torch.tensor([9.0, 8.0, 7.0, 6.0])  # group 1 holds the top 4
    scores[0, 5] = 6.0  # group 0 ties the 4th score with a lower id: it must win the 4th place
    scores[1, 600] = 6.0  # group 9 ties it with a higher id: it must lose
    s, i = grouped_topk(scores, 4, group=64)
    assert i.tolist() == [[100, 101, 102, 5], [100, 101, 102, 103]]
    assert s.tolist() == [[9.0, 8.0, 7.0, 6.0]] * 2


def test_exact_topk_orders_by_score_then_column_across_signs_and_zeros():
    scores = torch.tensor([[-0.0, 0.0, -1.5, 2.0, -1.5, float("inf"), 0.0, -float("inf")]])
    assert exact_topk(scores, 8).tolist() == [[5, 3, 0, 1, 6, 2, 4, 7]]  # -0.0 == 0.0: by column
    assert exact_topk(scores.half(), 4).tolist() == [[5, 3, 0, 1]]


def test_tied_rows_reselected_in_several_passes(monkeypatch):
    """Rows with a tie at the cut are re-selected a few at a time when their keys would not fit at once."""
    from local_dense_retriever.index import topk

    rng = np.random.default_rng(5)
    scores = _case(rng, 50, 3000, 4, torch.float16)  # four values: every row ties at the cut
    monkeypatch.setattr(topk, "TIE_KEY_BYTES", 8 * 3000 * 3)  # three rows per pass
    want_s, want_i = brute_force(scores, 6, 0)
    s, i = block_topk(scores, 6)
    np.testing.assert_array_equal(i.numpy(), want_i)
    np.testing.assert_array_equal(s.float().numpy(), want_s)
