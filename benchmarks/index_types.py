"""Index types against flat, through the real server: recall@3 against flat, q/s and p99 at C closed-loop clients,
and memory, for the flat index and each compressed or approximate type at a few nprobe / efSearch values.

    python benchmarks/index_types.py --data DATA --prepare 1000000   # every type at its default values
    python benchmarks/index_types.py --data DATA --types ivf_sq8 --values 8,16,32 --seconds 20

``--prepare N`` first writes the toy world's corpus of N passages and 2,000 questions into DATA and encodes it with the
bundled MiniLM (``build_index.py``, the first ``--max_length`` tokens of each passage; about 40 minutes for 1M on two
cores), unless DATA holds them already. Each type is built once from ``DATA/minilm_flat.npy`` (as ``build_index.py
--from_index`` does; kept in DATA for reruns) with the toy questions as recall queries, so recall@3 is the build's own
figure on real queries: the share of flat's top 3 found. Every point is a fresh server (``--nprobe`` /
``--ef_search``); flat is served as the server serves a .npy by default (the torch backend, with its pre-scan where
``--index_prefilter auto`` takes one). Memory: the index file's bytes (what the server holds for it: the flat file is
mapped, and a pre-scan copy comes on top) and the server's RSS once measured. Ratios are against flat in the same
run. Last, the memory at wiki-18's size under e5, with the arithmetic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import retriever_load as rl  # noqa: E402

DEFAULT_TYPES = ("ivf_sq8", "IVF4096,SQ6", "ivf_pq", "hnsw")
#: each type is served at the cheapest measured value reaching each of these recall@3 figures
RECALL_STEPS = (0.9, 0.95, 0.98, 0.99)
#: wiki-18 under e5-base-v2: passages and width
WIKI_ROWS, WIKI_DIM = 21_015_324, 768


def prepare(data: Path, passages: int, max_length: int) -> None:
    """The toy corpus, its questions and its flat MiniLM vectors in ``data``, made by the published commands."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (data / "corpus.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "local_dense_retriever.toy.corpus", "--out_dir", str(data),
                        "--num_passages", str(passages), "--num_questions", "2000"], check=True, cwd=root)  # fmt: skip
    if not (data / "minilm_flat.npy").is_file():
        subprocess.run([sys.executable, str(root / "local_dense_retriever" / "build_index.py"), "--corpus_path",
                        str(data / "corpus.jsonl"), "--output", str(data / "minilm_flat.npy"), "--retriever_name",
                        "minilm", "--retriever_model", str(rl.bundled_minilm()), "--device", "cpu", "--batch_size",
                        "128", "--max_length", str(max_length)], check=True)  # fmt: skip


def serve_values(record) -> list[int]:
    """The cheapest value of the record's curve reaching each of ``RECALL_STEPS`` (the best one if none does)."""
    from local_dense_retriever.artifacts.recall import pick_value

    return sorted({pick_value(record.curve, 3, step).value for step in RECALL_STEPS})


def question_vectors(data: Path) -> Path:
    """The toy questions encoded as queries with the bundled MiniLM (float32), cached as DATA/questions.npy."""
    path = data / "questions.npy"
    if not path.is_file():
        from local_dense_retriever.encoder import HFEncoder

        enc = HFEncoder(rl.bundled_minilm(), retriever_name="minilm", pooling="mean", device="cpu", dtype="float32")
        texts = rl.toy_questions(data / "corpus.jsonl")
        np.save(path, np.concatenate([enc.encode(texts[i : i + 64]).numpy() for i in range(0, len(texts), 64)]))
    return path


def index_file(data: Path, index_type: str) -> Path:
    """Where this benchmark keeps the build of ``index_type`` (kept in DATA for reruns)."""
    return data / f"minilm_{index_type.replace(',', '_').lower()}.index"


def built(data: Path, index_type: str, queries: Path) -> tuple[Path, dict, float | None]:
    """(index path, its build record, build seconds or None when it was already built)."""
    from local_dense_retriever.artifacts.compressed_build import (
        CompressedOptions,
        RecallQueries,
        build_compressed_index,
    )
    from local_dense_retriever.index.build_record import read_record

    out = index_file(data, index_type)
    record = read_record(out)
    seconds = None
    if record is None:
        vectors = np.load(queries)
        t0 = time.perf_counter()
        record = build_compressed_index(data / "minilm_flat.npy", out, CompressedOptions(index_type),
                                        RecallQueries(lambda: vectors, "toy questions", vectors.shape[1]))  # fmt: skip
        seconds = time.perf_counter() - t0
    return out, record, seconds


def measure(data: Path, index: Path, flags: list[str], args: argparse.Namespace) -> dict:
    corpus = data / "corpus.jsonl"
    questions = rl.toy_questions(corpus)
    with rl.serving(corpus, index, "auto", True, args.threads, *flags) as (proc, url):
        detail = rl.server_health(url)
        res = rl.measured(asyncio.run(rl.closed_loop(url, questions, args.clients, args.seconds, warmup=3.0)))
        rss = psutil.Process(proc.pid).memory_info().rss
    return {**res, "rss": rss, "detail": detail}


def search_alone(
    data: Path,
    index: Path,
    queries: np.ndarray,
    param: str | None,
    value: int | None,
    batch: int = 64,
    seconds: float = 3.0,
) -> float:
    """Queries/s of the index alone, loaded as the server loads it (flat: the torch backend with its pre-scan rule),
    searched in this process with batches of ``batch`` query vectors (no encoder, no HTTP)."""
    import gc

    import torch

    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.engine import load_flat_index
    from local_dense_retriever.index.faiss_index import FaissIndex

    if param is None and index.suffix == ".npy":
        config = ServerConfig(index_path=index, corpus_path=data / "corpus.jsonl", retriever_name="minilm")
        loaded = load_flat_index(config, index)
    else:
        knobs = {"nprobe": value} if param == "nprobe" else {"ef_search": value} if param == "efSearch" else {}
        loaded = FaissIndex(index, **knobs)
    batches = [torch.from_numpy(queries[i : i + batch]) for i in range(0, len(queries) - batch + 1, batch)]
    loaded.search(batches[0], 3)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for q in batches:
            loaded.search(q, 3)
            done += len(q)
    rate = done / (time.perf_counter() - t0)
    del loaded
    gc.collect()
    return rate


def code_bytes(path: Path) -> int:
    """Bytes of one vector's code in the index at ``path`` (what scales with the width; ids and links do not)."""
    import faiss

    index = faiss.read_index(str(path))
    try:
        return int(faiss.extract_index_ivf(index).code_size)
    except RuntimeError:
        inner = faiss.downcast_index(index)
        storage = getattr(inner, "storage", None)
        return int(faiss.downcast_index(storage).code_size if storage is not None else inner.code_size)


def extrapolate(rows: list[dict], n: int, dim: int) -> None:
    """Each type's memory at wiki-18's size, and the share of it a search reads, by the arithmetic printed."""
    import faiss

    from local_dense_retriever.artifacts.index_types import default_nlist

    flat_gb = WIKI_ROWS * WIKI_DIM * 4 / 1e9
    wiki_nlist = default_nlist(WIKI_ROWS)
    print(f"# at wiki-18 under e5 ({WIKI_ROWS:,} x {WIKI_DIM}): flat {WIKI_ROWS:,} x {WIKI_DIM} x 4 B = "
          f"{flat_gb:.1f} GB, every row read by every search; a code grows with the width, ids and graph links do "
          f"not; IVF centroids are lists x width x 4 B ({wiki_nlist:,} lists at wiki-18)")  # fmt: skip
    seen = set()
    for r in rows:
        if r["type"] in seen:
            continue
        seen.add(r["type"])
        code = code_bytes(r["path"])
        if r["param"] == "nprobe":
            nlist = int(faiss.extract_index_ivf(faiss.read_index(str(r["path"]))).nlist)
            wiki = (WIKI_ROWS * (code * WIKI_DIM / dim + 8) + wiki_nlist * WIKI_DIM * 4) / 1e9
            arithmetic = f"{WIKI_ROWS:,} x ({code} B x {WIKI_DIM}/{dim} + 8 B id) + {wiki_nlist:,} x {WIKI_DIM} x 4 B"
        else:
            links = r["index_bytes"] / n - code
            wiki = WIKI_ROWS * (code * WIKI_DIM / dim + links) / 1e9
            arithmetic = f"{WIKI_ROWS:,} x ({code} B x {WIKI_DIM}/{dim} + {links:.0f} B of links and ids)"
        print(f"#   {r['type']}: {arithmetic} = {wiki:.1f} GB, {wiki / flat_gb:.1%} of flat")
        if r["param"] == "nprobe":
            for value in sorted({x["value"] for x in rows if x["type"] == r["type"]}):
                share = value / nlist
                same = round(share * wiki_nlist)
                print(f"#     nprobe {value} of {nlist:,} lists reads {share:.2%} of the codes; at wiki-18, nprobe "
                      f"{same} of {wiki_nlist:,} reads the same share")  # fmt: skip


def query_curves(data: Path, types: list[str], sample: int) -> None:
    """Each built type's recall@3 over the whole sweep (``index_types.sweep``) twice: on the toy questions, and on
    ``sample`` passages of the corpus as queries (their own row left out, like the build's default queries)."""
    import faiss

    from local_dense_retriever.artifacts import index_types
    from local_dense_retriever.artifacts.recall import recall_curve
    from local_dense_retriever.index.faiss_params import search_param
    from local_dense_retriever.index.flat_file import read_flat_vectors, vector_file

    flat = data / "minilm_flat.npy"
    source = vector_file(flat)
    rows = np.sort(np.random.default_rng(0).choice(source.rows, sample, replace=False))
    sets = {"toy questions": (np.load(question_vectors(data)), None),
            f"{sample} passages": (np.asarray(read_flat_vectors(flat)[rows]), rows)}  # fmt: skip
    for index_type in types:
        index = faiss.read_index(str(index_file(data, index_type)))
        param, _ = search_param(index)
        for name, (queries, own) in sets.items():
            curve = recall_curve(index, source, queries, param=param, values=index_types.sweep(index, param),
                                 own_rows=own, ks=(3,))  # fmt: skip
            print(f"# {index_type}, {name}: recall@3 at {param} "
                  + ", ".join(f"{p.value}: {p.recall['3']:.3f}" for p in curve), flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder with corpus.jsonl, qa.jsonl and minilm_flat.npy")
    p.add_argument("--prepare", type=int, metavar="N", help="first make DATA: a toy corpus of N passages, encoded")
    p.add_argument("--max_length", type=int, default=32, help="--prepare: tokens of each passage encoded")
    p.add_argument("--types", default=",".join(DEFAULT_TYPES), help="index types, ';'-separated or ',' between names")
    p.add_argument("--values", help="nprobe / efSearch values to serve each type at (default: where its recall@3 "
                   "first reaches 0.9, 0.95, 0.98 and 0.99)")  # fmt: skip
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--threads", type=int, default=0, help="server threads (0: all cores)")
    p.add_argument("--curves", type=int, metavar="N", help="only print each built type's recall@3 over the whole "
                   "sweep, on the toy questions and on N passages as queries (own row left out)")  # fmt: skip
    args = p.parse_args(argv)
    types = args.types.split(";") if ";" in args.types else _split_types(args.types)
    if args.curves:
        query_curves(args.data, types, args.curves)
        return 0
    if args.prepare:
        args.data.mkdir(parents=True, exist_ok=True)
        prepare(args.data, args.prepare, args.max_length)
    flat_path = args.data / "minilm_flat.npy"
    n, dim = np.load(flat_path, mmap_mode="r").shape
    queries = question_vectors(args.data)
    rl.header("index types", n, "minilm", [])
    print(f"# {args.clients} closed-loop clients, {args.seconds:.0f} s a point; recall@3 against flat on "
          f"{len(np.load(queries))} toy questions")  # fmt: skip
    vectors = np.load(queries)
    flat = {"type": "flat", "param": None, "value": None, "recall": 1.0, "index_bytes": flat_path.stat().st_size,
            "alone": search_alone(args.data, flat_path, vectors, None, None),
            **measure(args.data, flat_path, [], args)}  # fmt: skip
    print(f"# flat server: {flat['detail']}")
    rows = []
    for index_type in types:
        path, record, seconds = built(args.data, index_type, queries)
        took = f", built in {seconds:.0f} s" if seconds is not None else ""
        print(f"# {index_type}: {record.factory}, {record.bytes / 2**20:,.0f} MiB{took}; recall@3 curve "
              + ", ".join(f"{p.value}: {p.recall['3']:.3f}" for p in record.curve))  # fmt: skip
        param = record.search_param
        values = serve_values(record) if param else [None]
        if args.values and param:
            values = [int(v) for v in args.values.split(",")]
        for value in values:
            flag = {"nprobe": ["--nprobe", str(value)], "efSearch": ["--ef_search", str(value)]}.get(param, [])
            row = {"type": index_type, "factory": record.factory, "path": path, "param": param, "value": value,
                   "recall": record.recall_at(value, 3), "index_bytes": record.bytes,
                   "alone": search_alone(args.data, path, vectors, param, value),
                   **measure(args.data, path, flag, args)}  # fmt: skip
            rows.append(row)
    print(f"{'index':16} {'param':>12} {'recall@3':>8} {'q/s':>8} {'x flat':>7} {'p99 ms':>8} {'search q/s':>10} "
          f"{'x flat':>7} {'index MiB':>9} {'x flat':>7} {'RSS MiB':>8} {'errors':>6}")  # fmt: skip
    for r in [flat, *rows]:
        param = f"{r['param']} {r['value']}" if r["param"] else "-"
        recall = f"{r['recall']:.3f}" if r["recall"] is not None else "?"
        print(f"{r['type']:16} {param:>12} {recall:>8} {r['qps']:>8.1f} {r['qps'] / flat['qps']:>6.2f}x "
              f"{r['p99_ms']:>8.1f} {r['alone']:>10.0f} {r['alone'] / flat['alone']:>6.1f}x "
              f"{r['index_bytes'] / 2**20:>9.0f} {r['index_bytes'] / flat['index_bytes']:>6.1%} "
              f"{r['rss'] / 2**20:>8.0f} {r['errors']:>6}")  # fmt: skip
    for what, key in (("the server's", "qps"), ("the search's", "alone")):
        hits = [r for r in rows if (r["recall"] or 0) >= 0.98 and r["index_bytes"] <= flat["index_bytes"] / 4
                and r[key] >= 5 * flat[key]]  # fmt: skip
        best = ", ".join(f"{r['type']} at {r['param']} {r['value']}" for r in hits) or "none"
        print(f"# meeting recall@3 >= 0.98, <= 1/4 of flat's memory and >= 5x {what} q/s: {best}")
    extrapolate(rows, n, dim)
    print(json.dumps({"flat": {k: v for k, v in flat.items() if k != "cpu"}, "rows": [
        {k: v for k, v in r.items() if k not in ("cpu", "detail")} for r in rows]}, default=str))  # fmt: skip
    return 0


def _split_types(text: str) -> list[str]:
    """``ivf_sq8,IVF4096,SQ6,hnsw`` -> the named types and the factory strings between them."""
    from local_dense_retriever.artifacts.index_types import NAMED_TYPES

    types: list[str] = []
    for part in text.split(","):
        if part in NAMED_TYPES or not types or types[-1] in NAMED_TYPES:
            types.append(part)
        else:
            types[-1] += "," + part
    return types


if __name__ == "__main__":
    sys.exit(main())
