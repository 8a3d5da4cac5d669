"""The search-backend interface: ``search(queries, k) -> (scores, ids)``, one row per query, best first. Invariant:
ids are corpus rows; a row is shorter than ``k`` only when the index holds fewer passages (never -1 slots)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from local_dense_retriever.errors import IndexLoadError

if TYPE_CHECKING:
    from local_dense_retriever.engine_meter import EngineMeter


class VectorIndex(Protocol):
    """Inner-product search over passage vectors: ``queries`` (n, dim) float → (scores float32 (n, k), ids int64
    (n, k))."""

    dim: int

    def __len__(self) -> int: ...
    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]: ...
    def describe(self) -> str: ...


class SearchBackend(Protocol):
    """Texts in, (scores, ids) out; what the engine calls from its worker thread."""

    def __len__(self) -> int: ...
    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...
    def describe(self) -> str: ...


class DenseSearch:
    """An encoder followed by a vector index."""

    def __init__(self, encoder, index: VectorIndex) -> None:
        if encoder.dim != index.dim:
            raise IndexLoadError(f"encoder width {encoder.dim} does not match index width {index.dim}")
        self.encoder = encoder
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def search(self, queries: list[str], k: int, meter: EngineMeter | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``meter``: the encoding and the index search are timed as its ``encode`` and ``search`` stages."""
        stage = meter.stage if meter is not None else (lambda _name: nullcontext())
        with stage("encode"):
            vectors = self.encoder.encode(queries, is_query=True)
        with stage("search"):
            return self.index.search(vectors, min(k, len(self.index)))

    def describe(self) -> str:
        dtype = getattr(self.encoder, "precision", None) or getattr(self.encoder, "dtype", None)
        where = f" ({str(dtype).removeprefix('torch.')} on {self.encoder.device})" if dtype is not None else ""
        return f"encoder{where}; {self.index.describe()}"
