"""Recall of an approximate index against the flat index it was built from: the exact top-k of held-out queries by a
streamed scan of the flat vectors, then, at each value of the index's search parameter, the share of those k found.

recall@k = mean over queries of |approximate top-k ∩ exact top-k| / k. A query that is itself a passage of the index
(the default: held-out passages) has its own row left out of both lists, so it cannot inflate the figure.
"""

from __future__ import annotations

import numpy as np
import torch

from local_dense_retriever.index.build_record import RecallPoint
from local_dense_retriever.index.faiss_params import set_search_value
from local_dense_retriever.index.flat_file import VectorFile
from local_dense_retriever.index.topk import merge_topk

#: the k the build reports recall at
RECALL_KS = (1, 3, 10)


def exact_topk(source: VectorFile, queries: np.ndarray, k: int) -> np.ndarray:
    """Row ids (n, k) of the ``k`` best inner products of each query over every row of ``source``, best first."""
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(q), 0), dtype=np.int64)
    for start, block in source.steps(0, source.rows):
        scores = q @ torch.from_numpy(block).T
        top = torch.topk(scores, min(k, scores.shape[1]), dim=1)
        ids = top.indices.numpy().astype(np.int64) + start
        best_s, best_i = merge_topk(np.hstack([best_s, top.values.numpy()]), np.hstack([best_i, ids]), k)
    return best_i


def _without(ids: np.ndarray, own: np.ndarray | None, k: int) -> np.ndarray:
    """Each row's first ``k`` ids, its own row (``own``) removed; -1 pads a row faiss could not fill."""
    if own is None:
        return ids[:, :k]
    out = np.full((len(ids), k), -1, dtype=np.int64)
    for r, row in enumerate(ids):
        kept = row[row != own[r]][:k]
        out[r, : len(kept)] = kept
    return out


def recall(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean share of each row's true top-``k`` among its found top-``k`` (-1 slots never match)."""
    hits = sum(len(set(f[:k].tolist()) & set(t[:k].tolist()) - {-1}) for f, t in zip(found, truth, strict=True))
    return hits / (k * len(truth))


def recall_curve(
    index,
    source: VectorFile,
    queries: np.ndarray,
    *,
    param: str | None,
    values: list[int | None],
    own_rows: np.ndarray | None = None,
    ks: tuple[int, ...] = RECALL_KS,
) -> list[RecallPoint]:
    """Recall@``ks`` of ``index`` at each of ``values`` of ``param``; ``own_rows``: each query's own row, if any."""
    ks = tuple(sorted({k for k in ks if k <= source.rows - (own_rows is not None)}))
    depth = max(ks) + (own_rows is not None)
    truth = _without(exact_topk(source, queries, depth), own_rows, max(ks))
    q = np.ascontiguousarray(queries, dtype=np.float32)
    points = []
    for value in values:
        if param is not None:
            set_search_value(index, param, value)
        _, ids = index.search(q, depth)
        found = _without(ids, own_rows, max(ks))
        points.append(RecallPoint(value, {str(k): round(recall(found, truth, k), 4) for k in ks}))
    return points


def pick_value(points: list[RecallPoint], k: int, target: float) -> RecallPoint:
    """The cheapest point (first in ``points``, which run cheap to dear) reaching ``target`` recall@k, else the best."""
    key = str(k)
    for point in points:
        if point.recall.get(key, 0.0) >= target:
            return point
    return max(points, key=lambda p: p.recall.get(key, 0.0))
