"""The retrieval server on a GPU under many concurrent single-query clients: batched against per-request.

What bounds the server when the encoder and the scan are fast.

    python benchmarks/gpu_server_load.py --json out.json                                        # on a CUDA machine
    python benchmarks/gpu_server_load.py --servers 1 4 --clients 256 --modes batched --no_engine_alone
    python benchmarks/gpu_server_load.py --device cpu --clients 16 --seconds 2 --passages 2000 --encoders minilm \\
        --load_procs 2                                                                          # a dry run anywhere

The server is the real CLI (``retrieval_server.py``, torch flat backend, its defaults otherwise: float16 encoder and
index on CUDA, micro-batches of up to 256 queries). ``--tokenizer DIR`` (default: the bundled all-MiniLM-L6-v2) holds
all-MiniLM-L6-v2's tokenizer and ``config.json``; where its weights are missing (no model hub is reachable on a lent
GPU machine) the encoders are built with seeded random weights of the model's exact shape, as in ``search_path.py``:
"minilm" (6 layers, width 384) and "e5" (e5-base-v2's BERT-base shape, width 768, the ``query: `` prefix). Their
speed is the real models', their rankings are meaningless; every answer still carries 3 hits, which the load
generator checks.

The corpus is the toy corpus of ``--passages`` rows with random unit passage vectors of the encoder's width. The load
comes from ``--load_procs`` processes sharing the C clients, so that the clients are not the bound on a many-core
host; each process reports the answers completed inside one common measured window. Per point: q/s, p50/p99,
failed requests, the batcher's mean batch, the server's CPU per query and its split (compute = encoding and search,
on the engine's thread and torch's threads; other = HTTP, validation, batching, serialisation), the server's CPU in
cores, and the cores the load generator used. Last, per encoder, the engine alone in this process (no HTTP, no
batcher) at the batched server's mean batch: the ceiling the server is measured against.

``--servers 1 2 4`` repeats each point with that many servers on the same device (each its own process, encoder and
copy of the index, as a fleet of several replicas per GPU would run): client i asks server i mod N, and the counts
and CPU figures are summed over the servers. One server is bound by its single Python interpreter, not the GPU; this
measures whether more interpreters on one GPU add throughput. ``--client tool`` sends the load through the search
tool's own client instead (``RetrievalClient``, one per load process as in a rollout worker: all the URLs, each call
to the server with the fewest requests in flight, its cache off so every question reaches a server, no rate limit).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import (  # noqa: E402
    ask_one,
    bundled_minilm,
    cpu_name,
    cpu_split,
    engine_alone,
    random_unit_vectors,
    repeated_share,
    server_argv,
    server_metrics,
    start_server,
    toy_dataset,
    toy_questions,
)
from search_path import e5_base_shaped, random_bert  # noqa: E402

WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def encoder_folder(name: str, tokenizer: Path, work: Path) -> Path:
    """The folder of encoder ``name``: the MiniLM folder itself when it holds weights, else a copy of its shape (or
    e5-base-v2's) with seeded random weights, beside its tokenizer files."""
    from transformers import BertConfig

    if name == "minilm" and any((tokenizer / w).is_file() for w in WEIGHTS):
        return tokenizer
    folder = work / f"{name}-shaped"
    if (folder / "config.json").is_file():
        return folder
    if name == "minilm":
        return random_bert(folder, tokenizer, BertConfig.from_pretrained(tokenizer))
    return e5_base_shaped(folder, tokenizer)


def distinct_questions(questions: list[str], n: int) -> list[str]:
    """At least ``n`` distinct texts: ``questions``, then numbered variants of them ("... (2)"). With fewer texts
    than clients, clients would ask the same text at the same moment, which the tool's client joins and the server
    encodes once per batch, and the load would be lighter than it looks."""
    out = list(questions)
    k = 2
    while len(out) < n:
        out += [f"{q} ({k})" for q in questions]
        k += 1
    return out


def tool_client_ask(urls: list[str], clients: int):
    """The search tool's own client for ``urls`` (as one rollout worker holds it) and an ``ask(question) -> bool``
    through it; call inside the running loop."""
    from verl_search import SearchToolConfig
    from verl_search.errors import RetrievalError
    from verl_search.tool.client import RetrievalClient

    config = SearchToolConfig.from_dict({"retrieval_service_url": urls, "topk": 3, "num_workers": clients,
                                         "rate_limit": None, "cache_size": 0, "timeout": 120,
                                         "attempt_timeout": 60, "request_format": "search_r1"})  # fmt: skip
    tool = RetrievalClient(config)
    loop = asyncio.get_running_loop()

    async def ask(question: str) -> bool:
        try:
            hits, _, _ = await tool.search([question], 3, deadline=loop.time() + 120)
        except RetrievalError:
            return False
        return len(hits[0]) == 3

    return tool, ask


def load_process(
    urls: list[str], questions: list[str], first: int, clients: int, stride: int, window: tuple, via: str
) -> dict:
    """One load process: ``clients`` closed-loop clients (client i asks questions first+i, first+i+stride, ...)
    until ``window[1]`` (time.monotonic(), shared by all processes on Linux); answers and failures are counted when
    they complete inside ``window``. ``via`` "aiohttp": client i asks server (first+i) mod len(urls) through a bare
    session; "tool": every client through this process's one search-tool client, which picks the server. Returns
    the latencies (s), the failures, and this process's CPU seconds."""
    import aiohttp

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    start, end = window
    latencies: list[float] = []
    errors = 0

    async def run() -> None:
        nonlocal errors
        tool, tool_ask = tool_client_ask(urls, clients) if via == "tool" else (None, None)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def client(i: int) -> None:
                nonlocal errors
                n = first + i
                url = urls[n % len(urls)]
                while (t0 := time.monotonic()) < end:
                    question = questions[n % len(questions)]
                    ok = await (tool_ask(question) if tool_ask else ask_one(session, url, question))
                    n += stride
                    t1 = time.monotonic()
                    if start <= t1 < end:
                        if ok:
                            latencies.append(t1 - t0)
                        else:
                            errors += 1

            await asyncio.gather(*(client(i) for i in range(clients)))
        if tool is not None:
            await tool.close()

    cpu0 = time.process_time()
    asyncio.run(run())
    return {"latencies": latencies, "errors": errors, "cpu_s": time.process_time() - cpu0}


def summed_metrics(urls: list[str]) -> dict:
    """The counters of /metrics that ``measure`` reads, summed over the servers at ``urls``."""
    snaps = [server_metrics(u) for u in urls]
    total = {k: sum(s[k] for s in snaps) for k in ("batches_total", "queries_total")}
    total["per_server_queries"] = [s["queries_total"] for s in snaps]
    total["duplicate_queries_total"] = sum(s.get("duplicate_queries_total", 0) for s in snaps)
    total["cpu_seconds"] = {  # the CPU seconds cpu_split reads (the stages' wall seconds are not summed)
        k: sum(s["cpu_seconds"][k] for s in snaps) for k in ("process", "native_threads", "encode", "search", "lookup")
    }
    return total


def measure(
    urls: list[str], questions: list[str], clients: int, procs: int, warmup: float, seconds: float, pool, via: str
) -> dict:
    """C clients spread over ``procs`` processes of ``pool`` and over the servers at ``urls``; counts and the
    servers' /metrics (summed) over the window."""
    procs = min(procs, clients)
    share = [clients // procs + (i < clients % procs) for i in range(procs)]
    t_start = time.monotonic() + 1.0 + warmup  # the processes are already up: a second to start their loops
    window = (t_start, t_start + seconds)
    firsts = np.cumsum([0, *share[:-1]])
    jobs = [
        pool.apply_async(load_process, (urls, questions, int(first), n, clients, window, via))
        for first, n in zip(firsts, share, strict=True)
    ]
    time.sleep(max(0.0, window[0] - time.monotonic()))
    before = summed_metrics(urls)
    time.sleep(max(0.0, window[1] - time.monotonic()))
    after = summed_metrics(urls)
    results = [j.get(timeout=300) for j in jobs]
    lat = np.concatenate([np.asarray(r["latencies"]) for r in results]) * 1000
    batches = after["batches_total"] - before["batches_total"]
    split = cpu_split(before["cpu_seconds"], after["cpu_seconds"])
    return {
        "qps": lat.size / seconds,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "errors": sum(r["errors"] for r in results),
        "completed": int(lat.size),
        "mean_batch": (after["queries_total"] - before["queries_total"]) / max(batches, 1),
        "repeated": repeated_share(before, after),
        "per_server_queries": [
            a - b for a, b in zip(after["per_server_queries"], before["per_server_queries"], strict=True)
        ],
        "cpu": split,
        "server_cores": split["process"] / seconds,
        "client_cores": sum(r["cpu_s"] for r in results) / (seconds + warmup + 1.0),
    }


def device_memory_mb(pids: list[int]) -> list[float] | None:
    """Each process's memory on the GPU (MiB, as ``nvidia-smi`` reports it: the CUDA context included), in the order
    of ``pids``; None where nvidia-smi is missing or does not list them (no GPU, or a container that hides pids)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    used = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[int(pid)] = float(mib)
    return [used[p] for p in pids] if all(p in used for p in pids) else None


def start_servers(n: int, server_args: tuple, **kwargs) -> list[tuple]:
    """``n`` servers (``retriever_load.start_server``'s arguments) started side by side, each once healthy; if one
    fails, those that started are stopped before the error goes on."""
    with concurrent.futures.ThreadPoolExecutor(n) as starter:
        futures = [starter.submit(start_server, *server_args, **kwargs) for _ in range(n)]
        concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for f in futures:
            if f.exception() is None:
                f.result()[0].terminate()
        raise failed[0]
    return [f.result() for f in futures]


def server_mode(spec: str) -> tuple[str, bool, list[str]]:
    """``batched``, ``per-request`` or ``LABEL=MODE FLAGS...`` → (label, batching, extra server flags)."""
    label, _, rest = spec.rpartition("=")
    mode, *flags = rest.split()
    if mode not in ("batched", "per-request"):
        raise argparse.ArgumentTypeError(f"{spec!r}: the mode must be batched or per-request")
    return label or mode, mode == "batched", flags


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tokenizer", type=Path, help="all-MiniLM-L6-v2's folder: config + tokenizer (default: the bundled one)"
    )
    p.add_argument("--encoders", nargs="+", choices=["minilm", "e5"], default=["minilm", "e5"])
    p.add_argument(
        "--modes",
        nargs="+",
        type=server_mode,
        default=[server_mode("batched"), server_mode("per-request")],
        help="server modes: 'batched', 'per-request', or 'LABEL=batched|per-request FLAGS...' for a server with "
        "extra flags, e.g. 'threads-1=per-request --unbatched_threads 1'",
    )
    p.add_argument("--clients", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument(
        "--servers",
        type=int,
        nargs="+",
        default=[1],
        help="servers on the device at once, each with its own index copy (client i asks server i mod N)",
    )
    p.add_argument(
        "--client",
        choices=["aiohttp", "tool"],
        default="aiohttp",
        help="aiohttp: bare sessions, client i on server i mod N; tool: the search tool's own client per load process",
    )
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each measured window")
    p.add_argument("--load_procs", type=int, default=8, help="load generator processes")
    p.add_argument("--threads", type=int, default=4, help="the server's torch CPU threads")
    p.add_argument("--device", default="auto", help="the server's --device")
    p.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "gpu_server_load", help="encoders, corpus, vectors"
    )
    p.add_argument(
        "--no_engine_alone",
        dest="engine_alone",
        action="store_false",
        help="skip the engine alone in this process at the batcher's mean batch (the server's ceiling)",
    )
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = p.parse_args()
    args.tokenizer = args.tokenizer or bundled_minilm()
    if not (args.tokenizer / "config.json").is_file():
        p.error(f"{args.tokenizer}: no config.json (want all-MiniLM-L6-v2's folder)")
    args.work.mkdir(parents=True, exist_ok=True)

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    now = datetime.now(timezone.utc)
    print(
        f"# gpu server load: {gpu}, {os.cpu_count()} host CPUs ({cpu_name()}), torch {torch.__version__}, "
        f"{args.passages:,} toy passages, {args.load_procs} load processes ({args.client} clients), "
        f"{now:%Y-%m-%d %H:%M} UTC",
        flush=True,
    )
    t0 = time.perf_counter()
    corpus = toy_dataset(args.work / f"toy-{args.passages}", args.passages)
    questions = distinct_questions(toy_questions(corpus), 2 * max(args.clients))
    folders = {name: encoder_folder(name, args.tokenizer, args.work) for name in args.encoders}
    print(f"# corpus and encoders ready in {time.perf_counter() - t0:.1f} s", flush=True)
    width = max(12, *(len(m[0]) for m in args.modes))
    print(f"{'encoder':7} {'mode':{width}} {'servers':>7} {'C':>5} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'errors':>6} {'batch':>6} {'repeated':>8} {'cpu/q ms':>8} {'compute':>7} {'other':>6} "
          f"{'server cores':>12} {'client cores':>12}")  # fmt: skip
    rows = []
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.load_procs) as pool:
        pool.map(time.sleep, [0.0] * args.load_procs)  # start the processes before the first point
        for name, folder in folders.items():
            dim = json.loads((folder / "config.json").read_text())["hidden_size"]
            npy = random_unit_vectors(args.work / f"random_{args.passages}_{dim}.npy", args.passages, dim)
            for (mode, batching, flags), n_servers in itertools.product(args.modes, args.servers):
                t_start = time.perf_counter()
                server_args = (corpus, npy, "torch", batching, args.threads, "--device", args.device, *flags)
                started = start_servers(n_servers, server_args, model=folder,
                                        retriever_name="e5" if name == "e5" else "minilm")  # fmt: skip
                procs = [proc for proc, _ in started]
                urls = [url for _, url in started]
                try:
                    import urllib.request

                    health = json.loads(urllib.request.urlopen(urls[0] + "/health", timeout=10).read())
                    shown = f" ({' '.join(flags)})" if flags else ""
                    print(f"# {name} {mode} server{shown} x{n_servers}, healthy {time.perf_counter() - t_start:.1f} s "
                          f"after the launch: {health.get('detail')}", flush=True)  # fmt: skip
                    for c in args.clients:
                        res = measure(urls, questions, c, args.load_procs, args.warmup, args.seconds, pool, args.client)
                        res["rss_mb"] = sum(psutil.Process(proc.pid).memory_info().rss for proc in procs) / 2**20
                        res["device_mb"] = device_memory_mb([proc.pid for proc in procs])
                        row = {"encoder": name, "mode": mode, "batching": batching, "flags": flags,
                               "servers": n_servers, "client": args.client, "clients": c, **res}  # fmt: skip
                        rows.append(row)
                        s = res["cpu"]
                        print(f"{name:7} {mode:{width}} {n_servers:>7} {c:>5} {res['qps']:>8.1f} {res['p50_ms']:>8.1f} "
                              f"{res['p99_ms']:>8.1f} {res['errors']:>6} {res['mean_batch']:>6.1f} "
                              f"{res['repeated']:>8.1%} "
                              f"{1000 * s['process'] / max(res['completed'], 1):>8.2f} {s['compute_share']:>7.1%} "
                              f"{s['other_share']:>6.1%} {res['server_cores']:>12.2f} "
                              f"{res['client_cores']:>12.2f}", flush=True)  # fmt: skip
                        if n_servers > 1:
                            print(f"#   queries per server in the window: {res['per_server_queries']}", flush=True)
                        if res["device_mb"]:
                            print(f"#   device memory per server (MiB): {res['device_mb']}", flush=True)
                finally:
                    for proc in procs:
                        proc.terminate()
                    for proc in procs:
                        proc.wait(30)
    ceilings = []
    for name, folder in folders.items():  # the ceiling: the engine alone in this process at the batcher's mean batch
        batched = [r for r in rows if r["encoder"] == name and r["batching"] and not r["flags"] and r["servers"] == 1]
        if not batched or not args.engine_alone:
            continue
        top = max(batched, key=lambda r: r["qps"])
        batch = max(1, round(top["mean_batch"]))
        dim = json.loads((folder / "config.json").read_text())["hidden_size"]
        npy = args.work / f"random_{args.passages}_{dim}.npy"
        argv = server_argv(corpus, npy, "torch", True, args.threads, "--device", args.device, model=folder,
                           retriever_name="e5" if name == "e5" else "minilm")  # fmt: skip
        alone = engine_alone(argv, args.threads, batch, questions)
        ceilings.append({"encoder": name, "engine_alone": alone, "batch": batch})
        print(f"# {name}: the engine alone (this process, no HTTP, no batcher) at the batcher's mean batch {batch}: "
              f"encoder {alone['encode']:.0f} q/s, encoder + search + corpus lookup {alone['engine']:.0f} q/s; the "
              f"server's best batched point ({top['qps']:.0f} q/s at C={top['clients']}) is "
              f"{top['qps'] / alone['engine']:.0%} of it", flush=True)  # fmt: skip
    for name in folders:
        ref = {r["clients"]: r["qps"] for r in rows
               if r["encoder"] == name and r["mode"] == "per-request" and r["servers"] == 1}  # fmt: skip
        one = {
            r["clients"]: r["qps"]
            for r in rows
            if r["encoder"] == name and r["mode"] == "batched" and r["servers"] == 1
        }
        for r in rows:
            if r["encoder"] != name or r["mode"] != "batched":
                continue
            if r["servers"] == 1 and ref.get(r["clients"]):
                print(f"{name} batched/per-request at C={r['clients']}: {r['qps'] / ref[r['clients']]:.1f}x")
            if r["servers"] > 1 and one.get(r["clients"]):
                print(f"{name} {r['servers']} servers / 1 at C={r['clients']}: {r['qps'] / one[r['clients']]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows + ceilings, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
