"""Encode a corpus jsonl into a flat inner-product index (``.npy`` and/or faiss file): batched, resumable, atomic.

Invariant: an output file exists only when complete; finished shards survive a crash and are reused on restart
when the corpus, model and shard size are unchanged.

    python local_dense_retriever/build_index.py --corpus_path wiki-18.jsonl --output e5_Flat.index \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2
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
    }
    meta_path = shard_dir / "meta.json"
    if shard_dir.exists() and (not meta_path.is_file() or json.loads(meta_path.read_text()) != meta):
        logger.warning("discarding shards in %s: they belong to another corpus/model/shard size", shard_dir)
        shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(meta_path) as tmp:
        tmp.write_text(json.dumps(meta))
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Encode a corpus jsonl into a flat inner-product index.")
    p.add_argument("--corpus_path", type=Path, required=True, help="corpus jsonl ({id, contents} per line)")
    p.add_argument(
        "--output",
        type=Path,
        action="append",
        required=True,
        help="output file, .npy or .index/.faiss (faiss IndexFlatIP); repeat for both",
    )
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.encoder import encoder_for

    try:
        CorpusStore(args.corpus_path).close()  # fail fast (and build the offsets table) before loading a model
        config = ServerConfig(
            retriever_name=args.retriever_name,
            retriever_model=args.retriever_model,
            pooling=args.pooling,
            fp16=args.fp16,
            encoder_dtype=args.encoder_dtype,
        )
        encoder = encoder_for(config, device=args.device, max_length=args.max_length)
        n = build_flat_index(
            args.corpus_path,
            args.output,
            encoder,
            model_id=args.retriever_model,
            batch_size=args.batch_size,
            shard_size=args.shard_size,
        )
    except (OSError, ValueError, RuntimeError) as e:
        print(f"build_index: error: {e}", file=sys.stderr)
        return 1
    print(f"build_index: {n} passages -> {', '.join(map(str, args.output))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
