"""Retriever on Ray Serve vs the plain server, in one run: closed-loop single-query clients (as retriever_load.py)
against the plain server, Serve with 1 replica, Serve with 2 replicas and Serve sharded (2 shards + router), each
Serve mode with its gateway (fleet-wide /health and /metrics, retry on a dead replica) and without it
(``--gateway_replicas 0``: the replicas take HTTP themselves).

    python benchmarks/serve_load.py                      # C = 64, 256; 100k toy passages; 8 s per point
    python benchmarks/serve_load.py --clients 1 64 --seconds 8 --cpu_split
    python benchmarks/serve_load.py --modes "serve 2 replicas" "serve 2 replicas, no gateway" -- --max_wait_ms 2

Every mode serves the same index and corpus with the same server flags (those after ``--`` included). Each Serve
mode is the published CLI, ``python -m local_dense_retriever.serve``, in a subprocess that starts its own local Ray
instance (replicas ask for 0.1 CPU each, so all fit on a small machine) and is stopped with SIGTERM, which removes
the application. Prints q/s, p50/p99, errors; ``--cpu_split`` adds each process's CPU per request (replicas summed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import (  # noqa: E402
    REPO,
    closed_loop,
    cpu_name,
    free_port,
    prepare,
    server_argv,
    split_server_flags,
    start_server,
    toy_questions,
)

#: the longest wait for a fleet to answer (its replicas load the encoder and the index)
FLEET_START_S = 600.0


def start_fleet(corpus: Path, npy: Path, replicas: int, shards: int, threads: int, gateways: int,
                flags: list[str]) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """``python -m local_dense_retriever.serve`` for this mode, once it prints ``RETRIEVER_URL=`` (its URL)."""
    fleet = ["--app_name", f"bench-{replicas}-{shards}-{gateways}", "--num_replicas", str(replicas), "--shards",
             str(shards), "--num_cpus", "0.1", "--gateway_replicas", str(gateways)]  # fmt: skip
    server = server_argv(corpus, npy, "torch", True, threads, *flags, port=free_port())
    stderr = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "local_dense_retriever.serve", *fleet, *server], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + FLEET_START_S
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            if line.startswith("RETRIEVER_URL="):
                return proc, line.strip().partition("=")[2]
        stop_fleet(proc)
        stderr.seek(0)
        raise SystemExit(f"the Serve fleet did not start within {FLEET_START_S:g} s: {stderr.read()[-2000:]}")
    finally:
        stderr.close()


def stop_fleet(proc: subprocess.Popen) -> None:
    """SIGTERM (the CLI removes the application and its local Ray instance ends with it); its process group is
    killed if it has not exited within a minute."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


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


def main(argv: list[str] | None = None) -> int:
    own, flags = split_server_flags(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Flags after -- go to every server.")
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--vectors", choices=["auto", "minilm", "random"], default="auto")
    p.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--modes", nargs="+", help="only these modes (names as printed); default: all")
    p.add_argument("--cpu_split", action="store_true", help="also print each process's CPU ms per request")
    args = p.parse_args(own)
    cpus = os.cpu_count() or 1
    half = max(1, cpus // 2)
    serve_modes = [  # name, replicas, shards, torch threads per replica, gateways
        ("serve 1 replica, no gateway", 1, 1, cpus, 0),
        ("serve 1 replica", 1, 1, cpus, 1),
        ("serve 2 replicas, no gateway", 2, 1, half, 0),
        ("serve 2 replicas", 2, 1, half, 1),
        ("serve 2 shards+router", 1, 2, half, 1),
    ]
    known = ["plain server", *(m[0] for m in serve_modes)]
    if unknown := set(args.modes or []) - set(known):
        p.error(f"unknown --modes {sorted(unknown)}; choose from {known}")
    wanted = set(args.modes or known)
    corpus, npy, _, kind = prepare(args.passages, args.vectors)
    questions = toy_questions(corpus)
    now = datetime.now(timezone.utc)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# serve load: {args.passages:,} passages, vectors={kind}, {cpus} CPUs ({cpu_name()}), "
          f"{now:%Y-%m-%d %H:%M} UTC; {load}")  # fmt: skip
    print(f"{'mode':28} {'C':>4} {'q/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'errors':>6}")
    rows = []

    def measure(mode: str, url: str) -> None:
        for c in args.clients:
            before = process_cpu() if args.cpu_split else {}
            res = asyncio.run(closed_loop(url, questions, c, args.seconds, warmup=min(3.0, args.seconds / 2)))
            res.pop("metrics")
            rows.append({"mode": mode, "clients": c, **res})
            print(f"{mode:28} {c:>4} {res['qps']:>8.1f} {res['p50_ms']:>9.1f} {res['p99_ms']:>9.1f} "
                  f"{res['errors']:>6}", flush=True)  # fmt: skip
            if args.cpu_split:  # over warm-up and measurement: per request of the whole run at its measured rate
                seconds = args.seconds + min(3.0, args.seconds / 2)
                split = cpu_per_request(before, process_cpu(), res["qps"] * seconds)
                rows[-1]["cpu_ms_per_request"] = split
                print("      CPU ms/request: " + ", ".join(f"{name} {ms:.2f}" for name, ms in split.items()))

    if "plain server" in wanted:
        proc, url = start_server(corpus, npy, "torch", True, cpus, *flags)
        try:
            measure("plain server", url)
        finally:
            proc.terminate()
            proc.wait(30)
    for mode, replicas, shards, threads, gateways in serve_modes:
        if mode not in wanted:
            continue
        t0 = time.perf_counter()
        proc, url = start_fleet(corpus, npy, replicas, shards, threads, gateways, flags)
        print(f"# {mode}: up in {time.perf_counter() - t0:.0f} s, Ray included (torch threads per replica: {threads})")
        try:
            measure(mode, url)
        finally:
            stop_fleet(proc)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
