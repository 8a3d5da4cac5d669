"""Retriever load: closed-loop clients sending single-query requests to the local retrieval server (a subprocess).

    python benchmarks/retriever_load.py            # full: C = 1, 16, 64, 256; batched/per-request x torch/faiss
    python benchmarks/retriever_load.py --quick    # C = 1, 64; batched torch, per-request torch, batched faiss

Each of C clients sends one query, waits for the answer, sends the next (the pattern of rollouts calling search).
The server is the real CLI (all-MiniLM-L6-v2 query encoder, a 100k-passage toy corpus, flat inner-product index).
Passage vectors: the cached MiniLM index of the toy corpus when it exists (``--vectors minilm``; built once by the
embedded default, slow on CPU), else seeded random unit vectors of the same shape (``--vectors random``): the
search cost is the same, only the ranking is meaningless. Prints q/s, p50/p99 latency, errors, server RSS, the
mean batch, and where the server's CPU went over the measured seconds (its /metrics ``cpu_seconds``): CPU ms per
answered query, the share in compute (encoding and index search, on the engine's thread and torch's worker threads),
in corpus lookup, and in everything else (HTTP, validation, batching, bookkeeping, serialisation). Last, the engine
alone in this process at the batcher's mean batch: the ceiling the batched server is measured against. With
``--encoder_dtype int8`` (or ``auto`` where it means int8: a CPU with VNNI and no bf16 matmuls) the per-request mode
is also run in float32 (faster there than int8's own), and the speed-up is taken against the faster of the two.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import get_args

import aiohttp
import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.config import Prefilter, default_cache_dir  # noqa: E402
from local_dense_retriever.encoder import bundled_minilm_path  # noqa: E402
from local_dense_retriever.toy.corpus import generate_toy_dataset  # noqa: E402
from verl_search.testing.background_server import free_port, wait_until_healthy  # noqa: E402
from verl_search.testing.scripted_demo import retrieval_recall  # noqa: E402

#: questions asked for recall@3 when the index holds real MiniLM vectors
RECALL_QUESTIONS = 1_000
SERVER = Path(__file__).resolve().parent.parent / "local_dense_retriever" / "retrieval_server.py"


def prepare(passages: int, vectors: str) -> tuple[Path, Path, Path, str]:
    """(corpus, npy index, faiss index, vectors kind) for the toy corpus of ``passages`` rows."""
    ds = generate_toy_dataset(default_cache_dir() / f"toy-{passages}", passages, seed=0)
    out = ds.corpus_path.parent
    minilm = out / "minilm_flat.npy"
    if vectors == "minilm" or (vectors == "auto" and minilm.is_file()):
        if not minilm.is_file():
            raise SystemExit(
                f"no cached MiniLM index at {minilm}: build it with build_index.py or use --vectors random"
            )
        npy, kind = minilm, "minilm"
    else:
        npy, kind = out / "random_384.npy", "random"
        if not npy.is_file():
            rng = np.random.default_rng(0)
            v = rng.standard_normal((passages, 384), dtype=np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            np.save(npy, v)
    faiss_path = npy.with_suffix(".index")
    if not faiss_path.is_file():
        import faiss

        index = faiss.IndexFlatIP(384)
        index.add(np.load(npy))
        faiss.write_index(index, str(faiss_path))
    return ds.corpus_path, npy, faiss_path, kind


def toy_questions(corpus: Path) -> list[str]:
    """The questions of the toy dataset whose corpus is ``corpus`` (its ``qa.jsonl`` beside it)."""
    return [json.loads(line)["question"] for line in (corpus.parent / "qa.jsonl").read_text().splitlines()]


def start_server(
    corpus: Path,
    index: Path,
    backend: str,
    batching: bool,
    threads: int,
    encoder_dtype: str,
    *extra: str,
    server: Path = SERVER,
    launcher: tuple[str, ...] = (),
    model: Path | None = None,
    retriever_name: str = "minilm",
) -> tuple[subprocess.Popen, str]:
    """The server script ``server`` (default: this tree's) on a free port, once healthy. ``launcher``: arguments
    between the interpreter and the script (e.g. ``-m memray run --native -o F``); ``model``: the query encoder's
    folder (default: the bundled MiniLM). The server's stderr goes to a temporary file (a pipe nobody reads would
    block a server that writes more than its buffer), whose end is shown if the server fails to start."""
    port = free_port()
    cmd = [sys.executable, *launcher, str(server), "--index_path", str(index), "--corpus_path", str(corpus),
           "--topk", "3", "--retriever_name", retriever_name, "--retriever_model", str(model or bundled_minilm_path()),
           "--backend", backend, "--port", str(port), "--num_threads", str(threads), "--log_level", "WARNING",
           "--max_queue", "100000", "--encoder_dtype", encoder_dtype]  # fmt: skip
    if not batching:
        cmd.append("--no_batching")
    cmd.extend(extra)
    stderr = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, timeout=300, what="retrieval server")
    except RuntimeError as e:
        stderr.seek(0)
        raise SystemExit(f"{e}: {stderr.read()[-2000:]}") from e
    finally:
        stderr.close()  # the server keeps its own descriptor
    return proc, url


def server_script(parser: argparse.ArgumentParser, tree: str | Path) -> Path:
    """The server script of source tree ``tree`` (e.g. another commit's worktree); none there is a usage error."""
    server = Path(tree).resolve() / "local_dense_retriever" / "retrieval_server.py"
    if not server.is_file():
        parser.error(f"{tree}: no {server}")
    return server


def server_trees(parser: argparse.ArgumentParser, specs: list[str]) -> dict[str, Path]:
    """``NAME=PATH`` source trees → the server script each holds (:func:`server_script`)."""
    trees = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        trees[name] = server_script(parser, path or name)
    return trees


async def ask_one(session: aiohttp.ClientSession, url: str, question: str) -> bool:
    """POST one single-query /retrieve; whether it came back 200 with 3 hits (any failure is False)."""
    body = {"queries": [question], "topk": 3, "return_scores": False}
    try:
        async with session.post(url + "/retrieve", json=body) as r:
            return r.status == 200 and len((await r.json())["result"][0]) == 3
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
        return False


@contextlib.contextmanager
def serving(*args, **kwargs):
    """``start_server(*args, **kwargs)``'s process and URL, terminated on the way out."""
    proc, url = start_server(*args, **kwargs)
    try:
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(30)


def server_metrics(url: str) -> dict:
    import urllib.request

    return json.loads(urllib.request.urlopen(url + "/metrics", timeout=10).read())


def bare_engine_qps(
    corpus: Path,
    npy: Path,
    threads: int,
    dtype: str,
    batch: int,
    questions: list[str],
    *,
    model: Path | None = None,
    retriever_name: str = "minilm",
    device: str = "auto",
    index_prefilter: str = "auto",
) -> dict:
    """Queries/s of the server's engine called directly in this process (no HTTP, no batcher) with batches of
    ``batch`` toy questions: the encoder alone, and encoder + flat search + corpus lookup (the server's ceiling).
    ``model``: the encoder's folder (default: the bundled MiniLM)."""
    import torch

    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.engine import load_engine

    torch.set_num_threads(threads)
    config = ServerConfig(index_path=str(npy), corpus_path=str(corpus), retriever_name=retriever_name, topk=3,
                          retriever_model=str(model or bundled_minilm_path()), backend="torch", num_threads=threads,
                          encoder_dtype=dtype, device=device, index_prefilter=index_prefilter)  # fmt: skip
    engine = load_engine(config, progress=False)
    encoder = engine.backend.encoder
    sync = torch.cuda.synchronize if encoder.device.type == "cuda" else (lambda: None)
    batches = [[questions[(i * batch + j) % len(questions)] for j in range(batch)] for i in range(64)]
    out = {}
    for name, call in (("encode", lambda b: encoder.encode(b)), ("engine", lambda b: engine.search(b, 3))):
        for b in batches[:3]:
            call(b)  # warm-up
        sync()
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 5:
            call(batches[done % len(batches)])
            done += 1
        sync()
        out[name] = done * batch / (time.perf_counter() - t0)
    return out


def repeated_share(before: dict, after: dict) -> float:
    """The share of the queries between two /metrics snapshots that repeated a text already in their batch (the
    engine encodes and searches it once): a load of distinct questions has none, else it was that much lighter."""
    repeated = after.get("duplicate_queries_total", 0) - before.get("duplicate_queries_total", 0)
    return repeated / max(after["queries_total"] - before["queries_total"], 1)


def cpu_split(before: dict, after: dict) -> dict:
    """The server's CPU seconds between two /metrics snapshots, split into compute (encoding and index search, on
    the engine's thread and torch's/faiss's native threads), corpus lookup and everything else (local_dense_retriever
    .cpu_time), with each part's share of the process's time."""
    d = {k: after[k] - before[k] for k in ("process", "native_threads", "encode", "search", "lookup")}
    compute = d["encode"] + d["search"] + d["native_threads"]
    total = max(d["process"], 1e-9)
    other = d["process"] - compute - d["lookup"]
    return {**d, "compute": compute, "other": other, "compute_share": compute / total,
            "lookup_share": d["lookup"] / total, "other_share": other / total}  # fmt: skip


async def closed_loop(
    url: str, questions: list[str], clients: int, seconds: float, warmup: float, *, group: int = 1
) -> dict:
    """C clients for ``warmup + seconds``; counts, latencies, the load generator's own CPU seconds and the server's
    /metrics are taken over the measured ``seconds`` only. ``group``: clients in groups of this many ask the same
    questions in the same order (a GRPO group's samples searching their question verbatim: the most duplicates a
    rollout can send); 1: every client its own."""
    latencies: list[float] = []
    errors = 0
    counting = False
    stop = False
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        groups = -(-clients // group)

        async def client(i: int) -> None:
            nonlocal errors
            n = i // group
            while not stop:
                question = questions[n % len(questions)]
                n += groups
                t0 = time.perf_counter()
                ok = await ask_one(session, url, question)
                if counting and not stop:
                    if ok:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors += 1

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(warmup)
        before = await asyncio.to_thread(server_metrics, url)
        counting, t_start, cpu_start = True, time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        stop, elapsed, client_cpu = True, time.perf_counter() - t_start, time.process_time() - cpu_start
        after = await asyncio.to_thread(server_metrics, url)
        await asyncio.gather(*tasks)
    lat = np.asarray(latencies) * 1000
    return {
        "qps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "errors": errors,
        "completed": len(latencies),
        "client_cpu_s": client_cpu,
        "metrics": (before, after),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="C = 1, 64 and three server modes, four with int8 (< 5 minutes)"
    )
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--vectors", choices=["auto", "minilm", "random"], default="auto")
    p.add_argument("--clients", type=int, nargs="*", help="concurrency levels (default 1 16 64 256; quick 1 64)")
    p.add_argument("--seconds", type=float, help="measured seconds per point (default 15; quick 8)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="server torch/faiss threads")
    p.add_argument(
        "--encoder_dtype",
        choices=["auto", "float32", "bfloat16", "int8"],
        default="auto",
        help="server encoder precision ('auto': bfloat16 where the CPU has bf16 instructions and it measures faster; "
        "'int8': int8 linear layers, for CPUs with VNNI and no bf16 hardware)",
    )
    p.add_argument(
        "--index_prefilter",
        choices=get_args(Prefilter),
        default="auto",
        help="the torch servers' pre-scan of the index ('auto': bfloat16 where oneDNN may use AMX, int8 where it may "
        "use VNNI); ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI stands for a CPU with VNNI but no bf16 hardware, AVX2 for one "
        "with neither, and 'auto' and the encoder's choice follow that cap",
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = p.parse_args()
    levels = args.clients or ([1, 64] if args.quick else [1, 16, 64, 256])
    seconds = args.seconds or (8.0 if args.quick else 15.0)
    modes = [
        ("torch", True, args.encoder_dtype),
        ("torch", False, args.encoder_dtype),
        ("faiss", True, args.encoder_dtype),
    ]
    # int8's own per-request mode is slower than float32's: the ratio takes the faster (also where 'auto' chose int8:
    # the first server's line says so, and the mode is added then)
    int8 = args.encoder_dtype == "int8"
    if int8:
        modes.insert(2, ("torch", False, "float32"))
    if not args.quick:
        modes.append(("faiss", False, args.encoder_dtype))

    corpus, npy, faiss_path, kind = prepare(args.passages, args.vectors)
    qa = corpus.parent / "qa.jsonl"
    qa_rows = [json.loads(line) for line in qa.read_text().splitlines()]
    questions = [q["question"] for q in qa_rows]
    now = datetime.now(timezone.utc)
    cpu = platform.processor() or platform.machine()
    # 'auto' is decided by each server at start-up (bf16 instructions + a timing probe): its /health line says which
    dtype = args.encoder_dtype if args.encoder_dtype != "auto" else "auto, see each server's line"
    print(f"# retriever load: {args.passages:,} passages, vectors={kind}, MiniLM queries ({dtype}), "
          f"{os.cpu_count()} CPUs ({cpu}), {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    print(f"{'backend':8} {'mode':12} {'C':>4} {'q/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'errors':>6} "
          f"{'RSS MB':>7} {'batch':>6} {'cpu/q ms':>8} {'compute':>7} {'lookup':>6} {'other':>6}")  # fmt: skip
    rows = []
    for backend, batching, encoder_dtype in modes:  # (may grow while it runs)
        index = faiss_path if backend == "faiss" else npy
        extra = ["--index_prefilter", args.index_prefilter] if backend == "torch" else []
        proc, url = start_server(corpus, index, backend, batching, args.threads, encoder_dtype, *extra)
        try:
            detail = httpx.get(f"{url}/health", timeout=10).json()["detail"]
            print(f"# {backend} {'batched' if batching else 'per-request'} server: {detail}", flush=True)
            if not int8 and encoder_dtype == "auto" and "(int8 on cpu)" in detail:
                int8 = True
                modes.insert(2, ("torch", False, "float32"))
            for c in levels:
                res = asyncio.run(closed_loop(url, questions, c, seconds, warmup=min(3.0, seconds / 2)))
                before, after = res.pop("metrics")
                batches = after["batches_total"] - before["batches_total"]
                res["mean_batch"] = (after["queries_total"] - before["queries_total"]) / max(batches, 1)
                res["cpu"] = cpu_split(before["cpu_seconds"], after["cpu_seconds"])
                res["repeated"] = repeated_share(before, after)
                rss = psutil.Process(proc.pid).memory_info().rss / 2**20
                row = {"backend": backend, "mode": "batched" if batching else "per-request", "clients": c, **res,
                       "rss_mb": rss, "encoder_dtype": encoder_dtype}  # fmt: skip
                rows.append(row)
                split = res["cpu"]
                cpu_ms = 1000 * split["process"] / max(res["completed"], 1)
                print(f"{backend:8} {row['mode']:12} {c:>4} {res['qps']:>8.1f} {res['p50_ms']:>9.1f} "
                      f"{res['p99_ms']:>9.1f} {res['errors']:>6} {rss:>7.0f} {res['mean_batch']:>6.1f} "
                      f"{cpu_ms:>8.2f} {split['compute_share']:>7.1%} {split['lookup_share']:>6.1%} "
                      f"{split['other_share']:>6.1%}", flush=True)  # fmt: skip
                if res["repeated"]:
                    print(f"#   {res['repeated']:.2%} of these queries repeated a text already in their batch (each "
                          "encoded once): the load was that much lighter", flush=True)  # fmt: skip
            if kind == "minilm" and backend == "torch" and batching:  # ranking is meaningful: report quality too
                recall = retrieval_recall(url, qa_rows[:RECALL_QUESTIONS], topk=3)
                print(f"# recall@3 over {min(len(qa_rows), RECALL_QUESTIONS)} toy questions: single-hop all "
                      f"supporting passages {recall.get(1, float('nan')):.3f}, two-hop a supporting passage "
                      f"{recall.get(2, float('nan')):.3f}", flush=True)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
    ref: dict[int, dict] = {}  # per C, the faster per-request reference (with int8 two were run: float32's may be)
    for r in rows:
        faster = r["qps"] > ref.get(r["clients"], {}).get("qps", 0)
        if r["backend"] == "torch" and r["mode"] == "per-request" and faster:
            ref[r["clients"]] = r
    for r in rows:
        if r["backend"] == "torch" and r["mode"] == "batched" and r["clients"] in ref:
            base = ref[r["clients"]]
            against = f" (against the faster per-request mode: {base['encoder_dtype']})" if int8 else ""
            print(f"speed-up batched/per-request (torch) at C={r['clients']}: {r['qps'] / base['qps']:.1f}x{against}, "
                  f"compute {r['cpu']['compute_share']:.1%} of the server's CPU")  # fmt: skip
    top = max((r for r in rows if r["backend"] == "torch" and r["mode"] == "batched"), key=lambda r: r["clients"])
    engine_qps = bare_engine_qps(corpus, npy, args.threads, args.encoder_dtype, round(top["mean_batch"]), questions,
                                 index_prefilter=args.index_prefilter)  # fmt: skip
    print(f"# the engine alone (no server, same CPU, {args.threads} threads) at the batcher's mean batch "
          f"{round(top['mean_batch'])}: encoder {engine_qps['encode']:.0f} q/s, encoder + flat search "
          f"{engine_qps['engine']:.0f} q/s; the server at C={top['clients']} reaches "
          f"{top['qps'] / engine_qps['engine']:.0%} of it")  # fmt: skip
    if args.json:
        rows.append({"engine_alone": engine_qps, "batch": round(top["mean_batch"])})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
