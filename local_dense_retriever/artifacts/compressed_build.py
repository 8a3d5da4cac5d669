"""Build any faiss index type from flat vectors (a ``.npy`` or a faiss flat inner-product file): train on a seeded
sample, add every row in streamed blocks, measure recall against the flat vectors, write the index and its record.

Invariants: the output and its record appear only when complete (atomic writes, record last); a killed build resumes
from ``<output>.parts/`` (the trained index, then the last checkpoint of rows added) when the source, the factory
string and the sample are unchanged; the rows sampled for training and for recall queries are disjoint.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from local_dense_retriever.artifacts import index_types
from local_dense_retriever.artifacts.recall import RECALL_KS, pick_value, recall_curve
from local_dense_retriever.artifacts.work_dir import claim_work_dir
from local_dense_retriever.index.build_record import BuildRecord, write_record
from local_dense_retriever.index.faiss_params import search_param, set_search_value
from local_dense_retriever.index.flat_file import STAGING_BYTES, VectorFile, read_flat_vectors, vector_file
from verl_search.atomic import atomic_path, remove_stale_temporaries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompressedOptions:
    """How to build: ``index_type`` (a named type or a faiss factory string), the training sample (``train_size``
    None: the type's default), the held-out recall queries, the recall target the stored search value must reach,
    and the seconds between checkpoints of rows added."""

    index_type: str
    train_size: int | None = None
    seed: int = 0
    recall_sample: int = 1000
    recall_k: int = 3
    target_recall: float = 0.98
    checkpoint_s: float = 600.0
    block_bytes: int = STAGING_BYTES
    progress: bool = True


@dataclass(frozen=True)
class RecallQueries:
    """Query vectors to measure recall with (``load`` runs once the index is built) and where they come from."""

    load: Callable[[], np.ndarray]
    source: str
    width: int | None = None  # known before the build (vectors of a file), else checked once encoded


def _samples(rows: int, train: int, held_out: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted row samples: ``train`` rows to train on and ``held_out`` rows (at most a fifth) as recall
    queries."""
    rng = np.random.default_rng([seed, 0x1D8])
    held_out = min(held_out, max(1, rows // 5))  # the rest trains: small corpora keep most of their rows for it
    order = rng.permutation(rows)
    queries = np.sort(order[:held_out])
    rest = order[held_out:]
    return np.sort(rest[: min(train, len(rest))]), queries


def _fingerprint(source: Path, vectors: VectorFile, factory: str, train_rows: int, held_out: int, seed: int) -> dict:
    import faiss

    stat = source.stat()
    return {"source": str(source.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "rows": vectors.rows, "dim": vectors.dim, "factory": factory, "train_rows": train_rows,
            "held_out": held_out, "seed": seed, "faiss": faiss.__version__}  # fmt: skip


class _Parts:
    """The work folder of one build: its fingerprint, the trained index, the last checkpoint and its row count."""

    def __init__(self, output: Path, fingerprint: dict) -> None:
        self.dir = output.with_name(output.name + ".parts")
        remove_stale_temporaries(output.parent, [output.name, output.name + ".build.json"])
        remove_stale_temporaries(self.dir)
        claim_work_dir(self.dir, fingerprint, "source, index type or sample")
        self.trained = self.dir / "trained.index"
        self.checkpoint = self.dir / "checkpoint.index"
        self.added = self.dir / "checkpoint.json"

    def resume(self):
        """(index, rows already added) from the last checkpoint, else the trained index with 0, else (None, 0)."""
        import faiss

        if self.checkpoint.is_file() and self.added.is_file():
            rows = int(json.loads(self.added.read_text())["rows"])
            logger.info("resuming from %s: %d rows already added", self.checkpoint.name, rows)
            return faiss.read_index(str(self.checkpoint)), rows
        if self.trained.is_file():
            logger.info("resuming from %s: training already done", self.trained.name)
            return faiss.read_index(str(self.trained)), 0
        return None, 0

    def save(self, index, path: Path, rows: int | None = None) -> None:
        import faiss

        with atomic_path(path) as tmp:
            faiss.write_index(index, str(tmp))
        if rows is not None:  # the count is written after the index it counts: a crash between keeps the older pair
            with atomic_path(self.added) as tmp:
                tmp.write_text(json.dumps({"rows": rows}))


def _train(index, vectors: np.ndarray, rows: np.ndarray) -> None:
    import faiss

    if index.is_trained:
        return
    logger.info("training on %d sampled vectors", len(rows))
    t0 = time.perf_counter()
    sample = np.ascontiguousarray(vectors[rows], dtype=np.float32)
    if isinstance(index, faiss.IndexPreTransform):
        _train_linear_chain(index, sample)
    else:
        index.train(sample)
    logger.info("trained in %.1f s", time.perf_counter() - t0)


def _train_linear_chain(index, sample: np.ndarray) -> None:
    """Train an ``IndexPreTransform`` as faiss does, each transform on the last one's output, but with every learned
    offset (PCA's centering) set to zero before its output is used: inner products are ranked after an affine map
    ``A(x - mean)`` by ``q·A'A·x - mean·A'A·x``, and that second term moves each row by its own amount, while the linear
    map ``A x`` keeps the ranking of the components it keeps."""
    import faiss

    for i in range(index.chain.size()):
        transform = faiss.downcast_VectorTransform(index.chain.at(i))
        if not transform.is_trained:
            transform.train(sample)
        if isinstance(transform, faiss.LinearTransform) and transform.have_bias:
            faiss.copy_array_to_vector(np.zeros(transform.d_out, dtype=np.float32), transform.b)
        sample = transform.apply(sample)
    index.index.train(sample)
    index.is_trained = True


def add_block(index, block: np.ndarray) -> None:
    """Add one streamed block of rows (its own function: the resumption tests interrupt it)."""
    index.add(block)


def _add_rows(index, source: VectorFile, start: int, parts: _Parts, options: CompressedOptions) -> None:
    from tqdm import tqdm

    last = time.monotonic()
    with tqdm(total=source.rows, initial=start, unit="vector", desc="adding", disable=not options.progress) as bar:
        for lo, block in source.steps(start, source.rows, options.block_bytes):
            add_block(index, block)
            bar.update(len(block))
            done = lo + len(block)
            if done < source.rows and time.monotonic() - last >= options.checkpoint_s:
                parts.save(index, parts.checkpoint, done)
                last = time.monotonic()


def build_compressed_index(
    source_path: Path, output: Path, options: CompressedOptions, queries: RecallQueries | None = None
) -> BuildRecord:
    """Build ``options.index_type`` from the flat vectors at ``source_path`` into ``output`` (and its record);
    recall is measured on ``queries``, else on held-out passages."""
    import faiss

    source_path, output = Path(source_path), Path(output)
    source = vector_file(source_path)
    if source.rows < 2:
        raise ValueError(f"{source_path} holds {source.rows} vector(s): too few to build an index from")
    if queries is not None and queries.width not in (None, source.dim):
        raise ValueError(f"recall queries ({queries.source}) are {queries.width} wide; the index is {source.dim} wide")
    factory = index_types.factory_string(options.index_type, source.rows, source.dim)
    index = index_types.make_index(factory, source.dim)
    nlist = index_types.default_nlist(source.rows)
    train_rows = options.train_size or index_types.train_size(source.rows, nlist)
    held_out = options.recall_sample if queries is None else 0
    train, own_rows = _samples(source.rows, train_rows, held_out, options.seed)
    parts = _Parts(output, _fingerprint(source_path, source, factory, len(train), held_out, options.seed))
    resumed, start = parts.resume()
    if resumed is None:
        _train(index, read_flat_vectors(source_path), train)
        parts.save(index, parts.trained)
    else:
        index = resumed
    _add_rows(index, source, start, parts, options)

    if queries is None:
        vectors = np.asarray(read_flat_vectors(source_path)[own_rows])
        query_source = "held-out passages (own row left out)"
    else:
        vectors, query_source = queries.load(), queries.source
    if vectors.ndim != 2 or vectors.shape[1] != source.dim:
        raise ValueError(f"recall queries ({query_source}) have shape {vectors.shape}; the index is {source.dim} wide")
    param, _ = search_param(index)
    logger.info("measuring recall against flat on %d queries: %s", len(vectors), query_source)
    curve = recall_curve(index, source, vectors, param=param, values=index_types.sweep(index, param),
                         own_rows=own_rows if held_out else None, ks=(*RECALL_KS, options.recall_k))  # fmt: skip
    chosen = pick_value(curve, options.recall_k, options.target_recall)
    if param is not None:
        set_search_value(index, param, chosen.value)
    reached = chosen.recall.get(str(options.recall_k), 0.0)
    if reached < options.target_recall:
        logger.warning("%s reaches recall@%d %.3f at best (%s=%s), under the target %.3f", factory, options.recall_k,
                       reached, param, chosen.value, options.target_recall)  # fmt: skip
    with atomic_path(output) as tmp:
        faiss.write_index(index, str(tmp))
    record = BuildRecord(
        index_type=options.index_type,
        factory=factory,
        rows=int(index.ntotal),
        dim=source.dim,
        bytes=output.stat().st_size,
        source=str(source_path.resolve()),
        train_rows=len(train),
        search_param=param,
        search_value=chosen.value,
        recall_queries=len(vectors),
        query_source=query_source,
        curve=curve,
        faiss_version=faiss.__version__,
    )
    write_record(output, record)
    shutil.rmtree(parts.dir)
    return record
