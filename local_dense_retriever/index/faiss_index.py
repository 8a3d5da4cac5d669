"""FaissIndex: any faiss index file (flat, HNSW, IVF, ...) on CPU, or an fp16 copy sharded over all GPUs. Invariant:
ids are corpus rows; faiss's -1 padding never reaches callers."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import torch

from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.build_record import BuildRecord, read_record
from local_dense_retriever.index.faiss_params import apply_gpu_nprobe, apply_knobs, search_param
from local_dense_retriever.index.index_info import IndexInfo, stored_recall
from local_dense_retriever.load_progress import LoadProgress, format_bytes

logger = logging.getLogger(__name__)

#: from this many queries on, faiss scores a batch with BLAS matmuls instead of row by row (its process-wide
#: ``distance_compute_blas_threshold``): the threshold faiss-cpu ships keeps batches of hundreds of queries off BLAS,
#: and their time then grows with every query
BLAS_MIN_QUERIES = 3
#: the threshold faiss ships -> what it counts: a batch's queries, or queries x dimension (newer faiss); a faiss with
#: another value is left alone
SHIPPED_RULES = {20: "queries", 128_000: "elements"}
#: bytes faiss hands the reader per call when it reads an index file (bounds the Python copy of each read)
READ_CHUNK_BYTES = 16 << 20
#: temporary memory faiss's StandardGpuResources reserves on each GPU it uses (its default on GPUs over 8 GiB)
GPU_SCRATCH_BYTES = 1536 << 20


@functools.cache
def shipped_blas_threshold() -> int:
    """faiss's own threshold, read before the server first sets it."""
    import faiss

    return int(faiss.cvar.distance_compute_blas_threshold)


def blas_threshold(dim: int, *, shipped: int, min_queries: int = BLAS_MIN_QUERIES) -> int | None:
    """faiss's threshold that sends batches of ``min_queries`` vectors of ``dim`` to BLAS; None: rule not known."""
    rule = SHIPPED_RULES.get(shipped)
    if rule is None:
        return None
    return min_queries * dim if rule == "elements" else min_queries


def set_blas_threshold(dim: int) -> None:
    """Have this process's faiss score batches of ``BLAS_MIN_QUERIES`` or more with BLAS (where its rule is known)."""
    import faiss

    if not hasattr(faiss.cvar, "distance_compute_blas_threshold"):
        return
    shipped = shipped_blas_threshold()
    value = blas_threshold(dim, shipped=shipped)
    if value is None:
        logger.warning("faiss %s ships distance_compute_blas_threshold = %d, a rule this server does not know: left "
                       "as it is (batches may be scored row by row)", faiss.__version__, shipped)  # fmt: skip
        return
    faiss.cvar.distance_compute_blas_threshold = value


def read_index(path: Path, progress: LoadProgress | None = None, *, chunk_bytes: int = READ_CHUNK_BYTES):
    """``faiss.read_index`` of ``path`` through a Python reader, so ``progress`` is told each chunk's bytes."""
    import faiss

    if progress is not None:
        progress.expect(path.stat().st_size)
    with open(path, "rb") as f:  # buffered: a read returns all it is asked for, short only at the end of the file

        def read(n: int) -> bytes:
            chunk = f.read(n)
            if progress is not None:
                progress.add(len(chunk))
            return chunk

        return faiss.read_index(faiss.PyCallbackIOReader(read, chunk_bytes))


class FaissIndex:
    """Wraps a faiss index read from disk, with its search-time parameter set from the knobs and what its build
    record (if any) says of it (``info``)."""

    def __init__(
        self,
        path: Path,
        *,
        gpu: bool = False,
        progress: LoadProgress | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        recall_k: int = 3,
    ) -> None:
        """``gpu``: an fp16 copy sharded over every visible GPU. ``progress`` is told the bytes of the file read.
        ``nprobe`` / ``ef_search``: set in the index (None: as stored); ``recall_k``: the k its recall is shown at."""
        import faiss

        path = Path(path)
        if not path.is_file():
            raise IndexLoadError(f"index file not found: {path}")
        try:
            index = read_index(path, progress)
        except RuntimeError as e:
            raise IndexLoadError(f"{path} is not a faiss index file: {str(e).splitlines()[0]}") from e
        kind = type(faiss.downcast_index(index)).__name__
        apply_knobs(index, what=f"{path.name} is a faiss {kind}", nprobe=nprobe, ef_search=ef_search)
        param, value = search_param(index)
        self._where = "cpu"
        #: the devices holding the index
        self.devices = [torch.device("cpu")]
        set_blas_threshold(int(index.d))
        rows, dim = int(index.ntotal), int(index.d)
        held, counted = path.stat().st_size, "the file's size, what a CPU faiss index holds"
        if gpu:
            ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
            if ngpu == 0:
                raise IndexLoadError("--faiss_gpu needs faiss-gpu (`pip install faiss-gpu`) and a visible CUDA GPU")
            co = faiss.GpuMultipleClonerOptions()
            co.useFloat16 = True
            co.shard = True
            logger.info("copying the index to %d GPU(s) as fp16 shards (faiss reports nothing until it is done)", ngpu)
            index = faiss.index_cpu_to_all_gpus(index, co=co)
            if param == "nprobe":
                apply_gpu_nprobe(index, value)
            self._where = f"{ngpu} GPU(s), fp16 shards"
            self.devices = [torch.device("cuda", i) for i in range(ngpu)]
            if kind.startswith("IndexFlat"):
                held, counted = rows * dim * 2, "fp16 vectors over the GPUs"
            else:
                counted = "the file's size (the GPU copy's own layout differs)"
        self._index = index
        self.dim = dim
        self._facts = (self._record(path), kind, param, value, held, counted)
        #: what the index is, its recall shown at ``recall_k``
        self.info = self.index_info(recall_k)

    def _record(self, path: Path) -> BuildRecord | None:
        """The build record beside ``path``, unless it describes another index (then ignored, with a warning)."""
        record = read_record(path)
        if record is not None and (record.rows, record.dim) != (len(self), self.dim):
            logger.warning("ignoring %s.build.json: it describes %d x %d rows, the index holds %d x %d", path.name,
                           record.rows, record.dim, len(self), self.dim)  # fmt: skip
            return None
        return record

    def index_info(self, k: int) -> IndexInfo:
        """What the index is, from the index itself and its build record, with its stored recall at ``k``."""
        record, kind, param, value, held, counted = self._facts
        if record is None and kind.startswith("IndexFlat"):  # exact: needs no record to know its recall
            recall, note, shown = {k: 1.0}, "exact: every row scored", k
        else:
            recall, note, shown = stored_recall(record, param, value, k)
        return IndexInfo(record.index_type if record else kind, record.factory if record else None, param, value,
                         recall, note, held, counted, recall_k=shown)  # fmt: skip

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def describe(self) -> str:
        size = format_bytes(self.info.bytes)
        return f"faiss {self.info.short()}, {len(self):,} x {self.dim} on {self._where}, {size}"

    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries.detach().float().cpu().numpy())
        scores, ids = self._index.search(q, min(k, len(self)))
        if (ids < 0).any():  # approximate indexes may return fewer hits than asked: drop the padding columns
            keep = int((ids >= 0).sum(axis=1).min())
            scores, ids = scores[:, :keep], ids[:, :keep]
        return scores.astype(np.float32), ids.astype(np.int64)
