"""The embedded default: a generated toy corpus encoded with the bundled all-MiniLM-L6-v2, built once and cached.

Invariant: the cache folder ``<cache_dir>/toy-<n>`` only ever holds complete files (every writer is atomic), so an
interrupted first start is simply resumed by the next one; the index is reused only when its sidecar names the same
corpus manifest and model, so a regenerated corpus never meets a stale index.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from local_dense_retriever.config import ServerConfig

logger = logging.getLogger(__name__)

MINILM_NAME = "minilm"


@dataclass(frozen=True)
class EmbeddedPaths:
    corpus_path: Path
    qa_path: Path
    index_path: Path
    model_path: Path


def prepare_embedded_default(config: ServerConfig, *, progress: bool = True) -> EmbeddedPaths:
    """Generate the toy corpus and its MiniLM flat index under the cache dir unless already there. Servers that start
    together on one cache dir (``launch_retriever.sh SERVERS=N``, a fleet's replicas) take turns: the first builds,
    the others wait and find it built."""
    from verl_search.atomic import exclusive

    out_dir = Path(config.cache_dir).expanduser() / f"toy-{config.toy_passages}"
    with exclusive(out_dir / ".build.lock", f"the embedded default in {out_dir}"):
        return _prepare(config, out_dir, progress)


def _prepare(config: ServerConfig, out_dir: Path, progress: bool) -> EmbeddedPaths:
    """:func:`prepare_embedded_default`'s work, by a process holding the folder's lock."""
    from local_dense_retriever.artifacts.build_index import build_flat_index
    from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path
    from local_dense_retriever.toy.corpus import generate_toy_dataset
    from verl_search.atomic import atomic_path

    model_path = bundled_minilm_path()
    dataset = generate_toy_dataset(out_dir, num_passages=config.toy_passages, seed=0)
    index_path = out_dir / "minilm_flat.npy"
    source_path = out_dir / "minilm_flat.npy.source.json"
    source = {"corpus_manifest": json.loads((out_dir / "toy.json").read_text()), "model": model_path.name}
    current = json.loads(source_path.read_text()) if source_path.is_file() else None
    if not index_path.is_file() or current != source:
        if index_path.is_file():
            logger.warning("the cached index %s was built from another corpus or model: rebuilding it", index_path)
        logger.info("building the embedded default index %s (once)", index_path)
        encoder = HFEncoder(
            model_path,
            retriever_name=MINILM_NAME,
            pooling="mean",
            device=config.device,
            dtype=config.requested_encoder_dtype(),
            max_length=config.query_max_length,
        )
        build_flat_index(
            dataset.corpus_path,
            [index_path],
            encoder,
            model_id=str(model_path),
            batch_size=64,
            shard_size=10_000,
            progress=progress,
        )
        with atomic_path(source_path) as tmp:
            tmp.write_text(json.dumps(source, sort_keys=True))
    return EmbeddedPaths(dataset.corpus_path, dataset.qa_path, index_path, model_path)
