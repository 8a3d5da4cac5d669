"""Sharded flat search: ``ShardSearcher`` holds one contiguous row range of a flat index; ``ShardedIndex`` (a
``VectorIndex`` for the router's engine) sends each batch of query vectors to every shard and merges exact top-k.

Invariant: global id = shard offset + local row; the merge keeps the single index's tie rule (``index.topk``), so
the sharded answer equals the one flat index's answer, ids and order included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.config import ServerConfig, is_flat_ip
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.flat_file import VectorFile
from local_dense_retriever.index.topk import merge_topk
from local_dense_retriever.index.torch_flat import shard_bounds as rows_split
from local_dense_retriever.serve.errors import ShardingError


def shard_bounds(passages: int, shards: int) -> list[tuple[int, int]]:
    """The index's own row split (``torch_flat.shard_bounds``), refused when a shard would hold no passage."""
    if shards > passages:
        raise ShardingError(f"{shards} shards for an index of {passages} passages: use at most {passages} shards")
    return rows_split(passages, shards)


def window(vectors: VectorFile, lo: int, hi: int) -> VectorFile:
    """Rows ``[lo, hi)`` of an index file as a file of their own (one shard's rows, streamed alone)."""
    return VectorFile(vectors.path, vectors.offset + lo * vectors.dim * 4, hi - lo, vectors.dim)


def check_shardable(config: ServerConfig, shards: int) -> int:
    """Passages of ``config``'s index when it can be cut into ``shards``; else a ShardingError naming the cause."""
    from local_dense_retriever.index.flat_file import read_flat_vectors

    if config.index_path is None or config.resolved_backend() == "bm25":
        raise ShardingError("sharded mode splits a dense flat index; bm25 indexes cannot be sharded")
    path = Path(config.index_path)
    if not is_flat_ip(path):
        raise ShardingError(f"{path} is not a flat inner-product index (.npy or faiss IndexFlatIP): it cannot be "
                            "split by rows; serve it unsharded")  # fmt: skip
    try:
        passages = int(read_flat_vectors(path).shape[0])
    except IndexLoadError as e:
        raise ShardingError(str(e)) from e
    shard_bounds(passages, shards)
    return passages


@dataclass(frozen=True)
class ShardInfo:
    lo: int
    hi: int
    total: int
    dim: int


class ShardSearcher:
    """Rows [lo, hi) of the flat index of ``config.index_path``, searched with the torch backend."""

    def __init__(self, config: ServerConfig, shard: int, shards: int) -> None:
        from local_dense_retriever.config import resolve_device
        from local_dense_retriever.engine import load_flat_index
        from local_dense_retriever.index.torch_flat import index_source

        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        vectors = index_source(Path(config.index_path), resolve_device(config.device), config.index_dtype)
        self.lo, self.hi = shard_bounds(int(vectors.shape[0]), shards)[shard]
        self.total = int(vectors.shape[0])
        mine = vectors[self.lo : self.hi] if isinstance(vectors, np.ndarray) else window(vectors, self.lo, self.hi)
        self.index = load_flat_index(config, mine)

    def info(self) -> ShardInfo:
        return ShardInfo(self.lo, self.hi, self.total, self.index.dim)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` of this shard for ``queries`` (n, dim), as global ids."""
        scores, ids = self.index.search(torch.from_numpy(queries), k)
        return scores, ids + self.lo


class ShardedIndex:
    """A VectorIndex whose rows live in shard deployments; call from a worker thread (it blocks on the shards)."""

    def __init__(self, handles: list) -> None:
        infos = [h.info.remote().result() for h in handles]
        infos, handles = zip(*sorted(zip(infos, handles, strict=True), key=lambda p: p[0].lo), strict=True)
        covered = [(i.lo, i.hi) for i in infos]
        total = infos[0].total
        edges = [0] + [hi for _, hi in covered]
        if [lo for lo, _ in covered] != edges[:-1] or edges[-1] != total:
            raise IndexLoadError(f"the shards do not cover the index's {total} rows exactly: {covered}")
        self._handles = list(handles)
        self.dim = infos[0].dim
        self._n = total

    def __len__(self) -> int:
        return self._n

    def describe(self) -> str:
        return f"{len(self._handles)} shards of a flat IP index, {self._n:,} x {self.dim} (Ray Serve fan-out)"

    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries.detach().float().cpu().numpy())
        replies = [h.search.remote(q, k) for h in self._handles]  # all shards work at once
        parts = [r.result() for r in replies]
        scores = np.concatenate([s for s, _ in parts], axis=1)
        ids = np.concatenate([i for _, i in parts], axis=1)
        return merge_topk(scores, ids, min(k, self._n))
