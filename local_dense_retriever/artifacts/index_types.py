"""The index types ``build_index.py --index_type`` names, as faiss factory strings sized to the corpus, and the values
of each family's search-time parameter (IVF: ``nprobe``, HNSW: ``efSearch``: ``index.faiss_params``) a build
measures."""

from __future__ import annotations

import math

#: the named types; any other --index_type is taken as a faiss factory string
NAMED_TYPES = ("flat", "hnsw", "ivf_sq8", "ivf_pq")
#: the values of each parameter a build measures recall at (those above the index's own bound are skipped)
SWEEPS = {"nprobe": tuple(2**i for i in range(13)), "efSearch": (16, 32, 64, 128, 256, 512, 1024)}
#: training vectors per IVF list: faiss warns below 39, and more than a few hundred changes little
TRAIN_PER_LIST = 64
MIN_TRAIN = 10_000


def default_nlist(rows: int) -> int:
    """IVF lists for ``rows`` vectors: the power of two nearest 4·√rows, at most one list per 39 vectors."""
    target = 4 * math.sqrt(max(rows, 1))
    nlist = 2 ** round(math.log2(target))
    return max(1, min(nlist, rows // 39))


def pq_bits(train_rows: int) -> int:
    """Bits per PQ code: 8 when the sample trains 256 centroids (39 vectors each), fewer on small corpora."""
    return max(1, min(8, int(math.log2(max(train_rows // 39, 2)))))


def factory_string(index_type: str, rows: int, dim: int) -> str:
    """The faiss factory string of ``index_type`` for ``rows`` vectors of width ``dim``."""
    nlist = default_nlist(rows)
    if index_type == "flat":
        return "Flat"
    if index_type == "hnsw":
        return "HNSW32"
    if index_type == "ivf_sq8":
        return f"IVF{nlist},SQ8"
    if index_type == "ivf_pq":
        m = next(m for m in (dim // 8, dim // 4, dim // 2, dim) if m >= 1 and dim % m == 0)  # 8 dims per byte
        return f"IVF{nlist},PQ{m}x{pq_bits(train_size(rows, nlist))}"
    return index_type


def train_size(rows: int, nlist: int) -> int:
    """Default training sample: enough for the IVF lists (and PQ's 256 centroids), at most every vector."""
    return min(rows, max(MIN_TRAIN, TRAIN_PER_LIST * nlist))


def make_index(factory: str, dim: int):
    """An empty inner-product faiss index of ``factory``; ValueError naming the string when faiss refuses it."""
    import faiss

    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"faiss cannot build index type {factory!r}: {str(e).splitlines()[0]}") from e


def sweep(index, param: str | None) -> list[int | None]:
    """The values of ``param`` a build measures: the sweep's values the index can take ([None]: no parameter)."""
    if param is None:
        return [None]
    if param == "nprobe":
        import faiss

        nlist = int(faiss.extract_index_ivf(index).nlist)
        values = [v for v in SWEEPS["nprobe"] if v <= nlist]
        return values if nlist > SWEEPS["nprobe"][-1] else sorted({*values, nlist})  # all lists: the exact end
    return list(SWEEPS[param])
