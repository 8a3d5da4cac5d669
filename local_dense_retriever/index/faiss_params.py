"""The search-time parameter of a faiss index (``nprobe`` of an IVF, ``efSearch`` of an HNSW), found through its
wrappers (IndexPreTransform, IndexIDMap, IndexRefine), read back and set from --nprobe / --ef_search. Invariant: a
knob the index does not have is an ``IndexLoadError`` naming the index and the knob that applies, never ignored."""

from __future__ import annotations

import logging

from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.index_info import KNOB_FLAGS

logger = logging.getLogger(__name__)


def _hnsw(index):
    """The IndexHNSW inside ``index`` (through its wrappers), or None."""
    import faiss

    seen = 0
    while index is not None and seen < 8:  # wrappers nest a few deep at most
        index = faiss.downcast_index(index)
        if hasattr(index, "hnsw"):
            return index
        inner = getattr(index, "base_index", None)  # IndexRefine; IndexPreTransform and IndexIDMap hold .index
        index = inner if inner is not None else getattr(index, "index", None)
        seen += 1
    return None


def search_param(index) -> tuple[str | None, int | None]:
    """(``nprobe`` or ``efSearch`` or None, its value in ``index``), read back from the index itself."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", int(ivf.nprobe)
    hnsw = _hnsw(index)
    if hnsw is not None:
        return "efSearch", int(hnsw.hnsw.efSearch)
    return None, None


def apply_knobs(index, *, what: str, nprobe: int | None, ef_search: int | None) -> None:
    """Set --nprobe / --ef_search on the CPU ``index`` (``what``: the file and its faiss class, for messages); raises
    IndexLoadError for a knob it does not have."""
    import faiss

    param, _ = search_param(index)
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        if value is None:
            continue
        if param != name:
            has = f"it is searched with {KNOB_FLAGS[param]}" if param else "it has no search-time parameter"
            family = "IVF" if name == "nprobe" else "HNSW"
            raise IndexLoadError(f"{KNOB_FLAGS[name]} {value}: {what}, which has no {name} ({has}); "
                                 f"{KNOB_FLAGS[name]} applies to {family} indexes")  # fmt: skip
        nlist = int(faiss.try_extract_index_ivf(index).nlist) if name == "nprobe" else 0
        if name == "nprobe" and value > nlist:
            logger.warning("--nprobe %d exceeds the index's %d lists: every list is searched", value, nlist)
        set_search_value(index, name, value)


def set_search_value(index, param: str, value: int) -> None:
    """Set ``nprobe`` or ``efSearch`` on a CPU index, through its wrappers (faiss's ParameterSpace)."""
    import faiss

    faiss.ParameterSpace().set_index_parameter(index, param, value)


def apply_gpu_nprobe(gpu_index, nprobe: int) -> None:
    """The GPU copy of an IVF index takes the CPU index's nprobe (the cloner copies it; set again to be sure)."""
    import faiss

    faiss.GpuParameterSpace().set_index_parameter(gpu_index, "nprobe", nprobe)
