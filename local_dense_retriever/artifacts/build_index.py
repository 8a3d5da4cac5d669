"""Encode a corpus jsonl into a flat inner-product index (``.npy`` and/or faiss file), or build any faiss index type
(``--index_type``) from a corpus or from existing flat vectors (``--from_index``): batched, resumable, atomic.

Invariant: an output file exists only when complete; finished shards (and a compressed build's trained index and
checkpoints) survive a crash and are reused on restart when their inputs are unchanged.

    python local_dense_retriever/build_index.py --corpus_path wiki-18.jsonl --output e5_Flat.index \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2
    python local_dense_retriever/build_index.py --from_index e5_Flat.index --index_type ivf_sq8 \
        --output e5_ivf_sq8.index
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import get_args

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see retrieval_server.py: spinning OpenMP stalls shared cores

from local_dense_retriever.artifacts.compressed_build import CompressedOptions, RecallQueries, build_compressed_index
from local_dense_retriever.artifacts.index_types import NAMED_TYPES
from local_dense_retriever.artifacts.work_dir import claim_work_dir
from local_dense_retriever.config import Precision, refuse_removed_flags
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.encoder import Encoder
from verl_search.atomic import atomic_path, remove_stale_temporaries

logger = logging.getLogger(__name__)

SUFFIXES = (".npy", ".index", ".faiss")


def _encode_shard(encoder: Encoder, texts: list[str], batch_size: int, bar) -> np.ndarray:
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths together: less padding
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    for lo in range(0, len(order), batch_size):
        rows = order[lo : lo + batch_size]
        out[rows] = encoder.encode([texts[i] for i in rows], is_query=False).float().cpu().numpy()
        bar.update(len(rows))
    return out


def build_flat_index(
    corpus_path: Path,
    outputs: list[Path],
    encoder: Encoder,
    *,
    model_id: str,
    batch_size: int = 64,
    shard_size: int = 100_000,
    progress: bool = True,
) -> int:
    """Encode every passage of ``corpus_path`` and write each of ``outputs``; returns the number of vectors."""
    from tqdm import tqdm

    outputs = [Path(p) for p in outputs]
    for out in outputs:
        if out.suffix not in SUFFIXES:
            raise ValueError(f"output {out} must end in one of {', '.join(SUFFIXES)}")
    corpus = CorpusStore(corpus_path, progress=progress)
    n = len(corpus)
    if n == 0:
        raise ValueError(f"corpus {corpus_path} has no rows")
    shard_dir = outputs[0].with_name(outputs[0].name + ".shards")
    for out in outputs:  # what a killed run left: its half-written outputs and shards
        remove_stale_temporaries(out.parent, [out.name])
    remove_stale_temporaries(shard_dir)
    meta = {
        "corpus": str(Path(corpus_path).resolve()),
        "corpus_bytes": Path(corpus_path).stat().st_size,
        "rows": n,
        "model": model_id,
        "dim": encoder.dim,
        "shard_size": shard_size,
        "max_length": getattr(encoder, "max_length", None),  # tokens kept per passage change every vector
    }
    claim_work_dir(shard_dir, meta, "corpus, model, shard size or passage length")
    starts = list(range(0, n, shard_size))
    paths = [shard_dir / f"shard-{i:05d}.npy" for i in range(len(starts))]
    done = sum(min(shard_size, n - s) for s, p in zip(starts, paths, strict=True) if p.is_file())
    with tqdm(total=n, initial=done, unit="passage", desc="encoding", disable=not progress) as bar:
        for start, path in zip(starts, paths, strict=True):
            if path.is_file():
                continue
            texts = [corpus.get(i)["contents"] for i in range(start, min(start + shard_size, n))]
            vectors = _encode_shard(encoder, texts, batch_size, bar)
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.save(f, vectors)
    for out in outputs:
        _assemble(paths, out, n, encoder.dim)
        logger.info("wrote %s (%d x %d)", out, n, encoder.dim)
    shutil.rmtree(shard_dir)
    corpus.close()
    return n


def _assemble(shards: list[Path], out: Path, n: int, dim: int) -> None:
    with atomic_path(out) as tmp:
        if out.suffix == ".npy":
            arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
            pos = 0
            for p in shards:
                part = np.load(p)
                arr[pos : pos + len(part)] = part
                pos += len(part)
            arr.flush()
            del arr
        else:
            import faiss

            index = faiss.IndexFlatIP(dim)
            for p in shards:
                index.add(np.load(p))
            faiss.write_index(index, str(tmp))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Encode a corpus jsonl into a flat inner-product index, or build a compressed or approximate faiss "
        "index (--index_type) from a corpus or from an existing flat index (--from_index)."
    )
    p.add_argument("--corpus_path", type=Path, help="corpus jsonl ({id, contents} per line) to encode")
    p.add_argument(
        "--from_index",
        type=Path,
        help="build --index_type from this flat index (.npy, or a faiss IndexFlatIP file) instead of encoding a corpus",
    )
    p.add_argument(
        "--output",
        type=Path,
        action="append",
        required=True,
        help="output file, .npy (flat vectors) or .index/.faiss (a faiss index of --index_type); repeat for several",
    )
    p.add_argument(
        "--index_type",
        default="flat",
        help=f"{', '.join(NAMED_TYPES)} (sized to the corpus), or any faiss factory string (e.g. 'IVF4096,SQ8', "
        "'HNSW64'); inner product throughout",
    )
    p.add_argument("--train_size", type=_positive, help="vectors sampled to train on (default: 64 per IVF list, "
                   "at least 10,000, at most all)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the training and held-out samples")
    p.add_argument("--recall_queries", type=Path, help="queries to measure recall against flat with: a jsonl "
                   "(question, query or text per line) encoded as queries, or a .npy of query vectors; default: "
                   "--recall_sample held-out passages")  # fmt: skip
    p.add_argument("--recall_sample", type=_positive, default=1000, help="held-out passages used as recall queries")
    p.add_argument("--recall_k", type=_positive, default=3, help="the k of --target_recall")
    p.add_argument("--target_recall", type=_share, default=0.98, help="the stored nprobe/efSearch is the cheapest "
                   "measured that reaches this recall@k against flat (else the best measured)")  # fmt: skip
    p.add_argument("--checkpoint_minutes", type=float, default=10.0, help="minutes between checkpoints while adding")
    p.add_argument("--retriever_name", default="e5", help="model family: e5 adds 'passage: ' prefixes")
    p.add_argument("--retriever_model", default="intfloat/e5-base-v2", help="HF model id or local folder")
    p.add_argument("--pooling", choices=["auto", "mean", "cls"], default="auto")
    p.add_argument("--max_length", type=int, default=256, help="tokens kept per passage")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--shard_size", type=int, default=100_000, help="passages per resumable shard")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--fp16", action=argparse.BooleanOptionalAction, default=True, help="half precision under --encoder_dtype auto"
    )
    p.add_argument("--no_fp16", dest="fp16", action="store_false", help="same as --no-fp16 (the server's spelling)")
    p.add_argument(
        "--encoder_dtype",
        choices=get_args(Precision),
        default="auto",
        help="'auto' = float16 on CUDA, bfloat16 on a CPU with native bf16 (avx512_bf16, amx_bf16), else float32",
    )
    refuse_removed_flags(p, argv)
    args = p.parse_args(argv)
    if (args.corpus_path is None) == (args.from_index is None):
        p.error("give --corpus_path (encode a corpus) or --from_index (reuse a flat index's vectors), not both")
    if args.from_index is not None and args.index_type == "flat":
        p.error("--from_index builds another index type from flat vectors: give --index_type (e.g. ivf_sq8)")
    if args.index_type != "flat" and not any(o.suffix != ".npy" for o in args.output):
        p.error(f"--index_type {args.index_type} writes a faiss file: give an --output ending in .index or .faiss")
    return args


class _LazyEncoder:
    """The encoder of ``args``, loaded on first use (a build from flat vectors may never need it)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self._encoder = args, None

    def get(self) -> Encoder:
        if self._encoder is None:
            from local_dense_retriever.config import ServerConfig
            from local_dense_retriever.encoder import encoder_for

            a = self.args
            config = ServerConfig(retriever_name=a.retriever_name, retriever_model=a.retriever_model,
                                  pooling=a.pooling, fp16=a.fp16, encoder_dtype=a.encoder_dtype)  # fmt: skip
            self._encoder = encoder_for(config, device=a.device, max_length=a.max_length)
        return self._encoder


QUERY_KEYS = ("question", "query", "text")


def query_texts(path: Path) -> list[str]:
    """The query of each line of a jsonl file (its first key of ``QUERY_KEYS``)."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not JSON: {e}") from e
            text = next((row[k] for k in QUERY_KEYS if isinstance(row, dict) and isinstance(row.get(k), str)), None)
            if text is None:
                raise ValueError(f"{path}:{n} has no string {', '.join(QUERY_KEYS)} field")
            texts.append(text)
    if not texts:
        raise ValueError(f"{path} holds no queries")
    return texts


def recall_queries(path: Path | None, encoder: _LazyEncoder, batch_size: int) -> RecallQueries | None:
    """The recall queries of ``--recall_queries`` (checked now, encoded when asked); None: held-out passages."""
    if path is None:
        return None
    if not path.is_file():
        raise ValueError(f"--recall_queries {path} does not exist")
    if path.suffix == ".npy":
        vectors = np.load(path)
        if vectors.ndim != 2 or len(vectors) == 0:
            raise ValueError(
                f"--recall_queries {path} holds an array of shape {vectors.shape}; expected (queries, dim)"
            )
        return RecallQueries(lambda: vectors.astype(np.float32), f"query vectors of {path.name}", vectors.shape[1])
    texts = query_texts(path)

    def load() -> np.ndarray:
        enc = encoder.get()
        parts = [enc.encode(texts[i : i + batch_size], is_query=True).float().cpu().numpy()
                 for i in range(0, len(texts), batch_size)]  # fmt: skip
        return np.concatenate(parts)

    return RecallQueries(load, f"questions of {path.name}")


def _flat_outputs(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """(flat outputs, compressed outputs): with --index_type flat every output is flat."""
    if args.index_type == "flat":
        return list(args.output), []
    return [o for o in args.output if o.suffix == ".npy"], [o for o in args.output if o.suffix != ".npy"]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    flat, compressed = _flat_outputs(args)
    encoder = _LazyEncoder(args)
    scratch = None
    try:
        queries = recall_queries(args.recall_queries, encoder, args.batch_size) if compressed else None
        if args.corpus_path is not None:
            CorpusStore(args.corpus_path).close()  # fail fast (and build the offsets table) before loading a model
            if not flat:  # the vectors a compressed build reads, removed once it is done
                scratch = compressed[0].with_name(compressed[0].name + ".vectors.npy")
            n = build_flat_index(args.corpus_path, flat or [scratch], encoder.get(), model_id=args.retriever_model,
                                 batch_size=args.batch_size, shard_size=args.shard_size)  # fmt: skip
            if flat:
                print(f"build_index: {n} passages -> {', '.join(map(str, flat))}")
        source = args.from_index if args.from_index is not None else (flat[0] if flat else scratch)
        options = CompressedOptions(
            index_type=args.index_type,
            train_size=args.train_size,
            seed=args.seed,
            recall_sample=args.recall_sample,
            recall_k=args.recall_k,
            target_recall=args.target_recall,
            checkpoint_s=args.checkpoint_minutes * 60,
        )
        for out in compressed:
            record = build_compressed_index(source, out, options, queries)
            at = f" at {record.search_param} {record.search_value}" if record.search_param else ""
            got = record.recall_at(record.search_value, args.recall_k)
            print(f"build_index: {record.rows} vectors -> {out} ({record.factory}, {record.bytes / 2**20:,.1f} MiB, "
                  f"recall@{args.recall_k} {got}{at} against flat)")  # fmt: skip
        if scratch is not None:
            scratch.unlink()
    except (OSError, ValueError, RuntimeError) as e:
        print(f"build_index: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
