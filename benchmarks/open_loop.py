"""Retriever under open-loop load: single-query requests arriving at a fixed mean rate (Poisson), whatever the answers.

    python benchmarks/open_loop.py                                   # this tree, rates 100 300 500 650 q/s
    python benchmarks/open_loop.py before=/tmp/before main=. --rates 200 600 --seconds 20 --rounds 2
    python benchmarks/open_loop.py --rates 300 -- --max_wait_ms 2    # flags after -- go to every server

Closed-loop clients (``retriever_load.py``) send again as soon as they are answered; RL rollouts are closer to open
loop: a trajectory's search arrives when its model stops generating, not when the last search is answered. A batcher
that waits for callers to come back idles the engine under such load; this shows what it costs. Each tree's server
(``local_dense_retriever/retrieval_server.py``) serves the 100k-passage toy corpus as in ``retriever_load.py``; the
trees take turns at every rate. Latency is counted from each request's scheduled arrival, so a load generator that
falls behind shows as latency, not as a lighter load. Per line: the rate offered and answered, p50/p99/max latency,
the batcher's mean batch and the failed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import retriever_load  # noqa: E402


async def poisson_load(url: str, questions: list[str], rate: float, seconds: float, seed: int) -> dict:
    """Requests at Poisson arrivals of mean ``rate`` per second for ``seconds``; latencies from the scheduled times."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, size=int(rate * seconds * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(i: int, due: float) -> None:
            nonlocal errors
            if await retriever_load.ask_one(session, url, questions[i % len(questions)]):
                latencies.append(time.perf_counter() - due)
            else:
                errors += 1

        before = await asyncio.to_thread(retriever_load.server_metrics, url)
        t0 = time.perf_counter()
        tasks = []
        for i, at in enumerate(arrivals):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, t0 + at)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        after = await asyncio.to_thread(retriever_load.server_metrics, url)
    lat = np.asarray(latencies) * 1000
    return {
        "offered": len(arrivals) / seconds,
        "answered": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "max_ms": float(lat.max()) if lat.size else float("nan"),
        "batch": retriever_load.mean_batch(before, after),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    own, flags = retriever_load.split_server_flags(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Flags after -- go to every server.")
    p.add_argument("trees", nargs="*", default=["main=."], help="NAME=PATH of a source tree (default: main=.)")
    p.add_argument("--rates", type=float, nargs="+", default=[100, 300, 500, 650])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the servers' --num_threads")
    args = p.parse_args(own)
    trees = retriever_load.server_trees(p, args.trees)

    corpus, npy, _, kind = retriever_load.prepare(100_000, "auto")
    questions = retriever_load.toy_questions(corpus)
    retriever_load.header(f"open-loop load, batched torch servers, Poisson arrivals, {args.seconds:g} s a point after "
                          "a 3 s warm-up", 100_000, kind, flags)  # fmt: skip
    print(f"{'round':>5} {'tree':>10} {'offered':>8} {'answered':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'batch':>6} {'errors':>6}")  # fmt: skip
    for rnd in range(args.rounds):
        for name, server in trees.items():
            server_args = (corpus, npy, "torch", True, args.threads, *flags)
            with retriever_load.serving(*server_args, server=server) as (_, url):
                asyncio.run(poisson_load(url, questions, args.rates[0], 3.0, seed=12345))  # warm-up
                for j, rate in enumerate(args.rates):
                    r = asyncio.run(poisson_load(url, questions, rate, args.seconds, seed=1000 * rnd + j))
                    print(f"{rnd + 1:5d} {name:>10} {r['offered']:8.1f} {r['answered']:8.1f} {r['p50_ms']:8.1f} "
                          f"{r['p99_ms']:8.1f} {r['max_ms']:8.1f} {r['batch']:6.1f} {r['errors']:6d}",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
