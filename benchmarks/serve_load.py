"""Retriever on Ray Serve vs the plain server, in one run: closed-loop single-query clients (as retriever_load.py)
against the plain server, Serve with 1 replica, Serve with 2 replicas and Serve sharded (2 shards + router), each
Serve mode with its gateway (the default: fleet-wide /health and /metrics, retry on a dead replica) and without it
(``gateway_replicas=0``: the replicas take HTTP themselves).

    python benchmarks/serve_load.py                      # C = 64, 256; 100k toy passages; 8 s per point
    python benchmarks/serve_load.py --clients 64 --seconds 5 --passages 20000
    python benchmarks/serve_load.py --modes "serve 2 replicas" "serve 2 replicas, no gateway"

Every mode serves the same index and corpus with the same batching settings; Serve runs in a local Ray instance
started by this process (replicas ask for 0.1 CPU each, so all fit on a small machine). Prints q/s, p50/p99, errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import closed_loop, prepare, start_server, toy_questions  # noqa: E402

from local_dense_retriever.config import ServerConfig  # noqa: E402
from local_dense_retriever.encoder import bundled_minilm_path  # noqa: E402
from verl_search.testing.background_server import free_port  # noqa: E402


def serve_mode(corpus: Path, npy: Path, replicas: int, shards: int, threads: int, gateways: int):
    from local_dense_retriever.serve.fleet import start_fleet
    from local_dense_retriever.serve.options import ServeOptions

    config = ServerConfig(index_path=npy, corpus_path=corpus, retriever_name="minilm",
                          retriever_model=str(bundled_minilm_path()), backend="torch", port=free_port(),
                          num_threads=threads, max_queue=100_000)  # fmt: skip
    options = ServeOptions(app_name=f"bench-{replicas}-{shards}-{gateways}", num_replicas=replicas, shards=shards,
                           num_cpus=0.1, gateway_replicas=gateways)  # fmt: skip
    return start_fleet(config, options), options


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process on this machine, with a short name (Ray names its actor processes)."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            times = proc.cpu_times()
            name = " ".join(proc.info["cmdline"] or [])[:60].strip() or proc.name()
            out[proc.pid] = (name, times.user + times.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def cpu_per_request(before: dict, after: dict, requests: float, top: int = 4) -> dict[str, float]:
    """The processes that used the most CPU between two ``process_cpu`` samples, in ms per request (processes of
    one name, such as a deployment's replicas, summed)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        if pid in before:
            used[name.removeprefix("ray::")] = used.get(name.removeprefix("ray::"), 0.0) + seconds - before[pid][1]
    ranked = sorted(used.items(), key=lambda item: -item[1])[:top]
    return {name: round(seconds / max(requests, 1.0) * 1000, 3) for name, seconds in ranked}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--vectors", choices=["auto", "minilm", "random"], default="auto")
    p.add_argument("--clients", type=int, nargs="*", default=[64, 256])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--modes", nargs="*", help="only these modes (names as printed); default: all")
    p.add_argument("--cpu_split", action="store_true", help="also print each process's CPU ms per request")
    args = p.parse_args()
    cpus = os.cpu_count() or 1
    half = max(1, cpus // 2)
    serve_modes = [  # name, replicas, shards, torch threads per replica, gateways
        ("serve 1 replica, no gateway", 1, 1, cpus, 0),
        ("serve 1 replica", 1, 1, cpus, 1),
        ("serve 2 replicas, no gateway", 2, 1, half, 0),
        ("serve 2 replicas", 2, 1, half, 1),
        ("serve 2 shards+router", 1, 2, half, 1),
    ]
    wanted = set(args.modes or ["plain server", *(m[0] for m in serve_modes)])
    corpus, npy, _, kind = prepare(args.passages, args.vectors)
    questions = toy_questions(corpus)
    now = datetime.now(timezone.utc)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# serve load: {args.passages:,} passages, vectors={kind}, {cpus} CPUs, {now:%Y-%m-%d %H:%M} UTC; {load}")
    print(f"{'mode':28} {'C':>4} {'q/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'errors':>6}")
    rows = []

    def measure(mode: str, url: str) -> None:
        for c in args.clients:
            before = process_cpu() if args.cpu_split else {}
            res = asyncio.run(closed_loop(url, questions, c, args.seconds, warmup=min(3.0, args.seconds / 2)))
            rows.append({"mode": mode, "clients": c, **res})
            print(f"{mode:28} {c:>4} {res['qps']:>8.1f} {res['p50_ms']:>9.1f} {res['p99_ms']:>9.1f} "
                  f"{res['errors']:>6}", flush=True)  # fmt: skip
            if args.cpu_split:  # over warm-up and measurement: per request of the whole run at its measured rate
                seconds = args.seconds + min(3.0, args.seconds / 2)
                split = cpu_per_request(before, process_cpu(), res["qps"] * seconds)
                rows[-1]["cpu_ms_per_request"] = split
                print("      CPU ms/request: " + ", ".join(f"{name} {ms:.2f}" for name, ms in split.items()))

    if "plain server" in wanted:
        proc, url = start_server(corpus, npy, "torch", True, cpus, "auto")
        try:
            measure("plain server", url)
        finally:
            proc.terminate()
            proc.wait(30)

    import ray
    from ray import serve

    from local_dense_retriever.serve.fleet import stop_fleet

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        for mode, replicas, shards, threads, gateways in serve_modes:
            if mode not in wanted:
                continue
            t0 = time.perf_counter()
            url, options = serve_mode(corpus, npy, replicas, shards, threads, gateways)
            print(f"# {mode}: up in {time.perf_counter() - t0:.0f} s (torch threads per replica: {threads})")
            try:
                measure(mode, url)
            finally:
                stop_fleet(options)
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
