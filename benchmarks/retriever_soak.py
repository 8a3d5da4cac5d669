"""Retriever soak: C closed-loop single-query clients against the batched server for many minutes, sampling its memory.

    python benchmarks/retriever_soak.py                          # 30 minutes, C = 64, a sample every 10 s
    python benchmarks/retriever_soak.py --minutes 5 -- --malloc_trim_s 0    # flags after -- go to the server

The server is the real CLI on the 100k-passage toy corpus (as ``retriever_load.py``). Every sample reads its
``/metrics``: RSS (its anonymous and file-backed parts) and the C heap (``in_use``: allocated; ``free``: held by
malloc; ``mapped``: large blocks mapped on their own), the queries answered since the last sample and their mean
batch (the batcher's regime). After the warm-up, RSS is fitted with a line: the growth per minute, the last sample
against the first, and the means of whole 10-minute windows (RSS swings by tens of MB between malloc trims) are the
verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import (  # noqa: E402
    ask_one,
    cpu_name,
    prepare,
    server_metrics,
    split_server_flags,
    start_server,
    toy_questions,
)

MB = 2**20


async def sampled_closed_loop(
    url: str, questions: list[str], clients: int, minutes: float, sample_s: float, on_sample
) -> None:
    """C closed-loop single-query clients for ``minutes``; every ``sample_s`` seconds,
    ``await on_sample(t_s, answered, errors)``, with the running counts of answers and failed requests."""
    stop = False
    answered = errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def client(i: int) -> None:
            nonlocal answered, errors
            n = i
            while not stop:
                ok = await ask_one(session, url, questions[n % len(questions)])
                n += clients
                answered += ok
                errors += not ok

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < minutes * 60:
            await asyncio.sleep(sample_s)
            await on_sample(time.perf_counter() - t0, answered, errors)
        stop = True
        await asyncio.gather(*tasks)


async def soak(url: str, questions: list[str], clients: int, minutes: float, sample_s: float) -> list[dict]:
    """The closed loop for ``minutes``, with a row of the server's memory and throughput every ``sample_s``."""
    print(f"{'t s':>7} {'RSS MB':>8} {'anon':>8} {'file':>7} {'in use':>8} {'free':>8} {'mapped':>8} {'q/s':>7} "
          f"{'batch':>6} {'errors':>6}")  # fmt: skip
    samples: list[dict] = []
    last = {"t_s": 0.0, "answered": 0, "batches": 0}

    async def on_sample(t_s: float, answered: int, errors: int) -> None:
        metrics = await asyncio.to_thread(server_metrics, url)
        memory = metrics["memory_bytes"] or {}
        batches = metrics["batches_total"] - last["batches"]  # the batcher's mean batch over this sample
        done = answered - last["answered"]
        sample = {"t_s": t_s, "qps": done / (t_s - last["t_s"]), "errors": errors,
                  "mean_batch": done / batches if batches else None,
                  **{f"{k}_mb": v / MB for k, v in memory.items()}}  # fmt: skip
        last.update(t_s=t_s, answered=answered, batches=metrics["batches_total"])
        samples.append(sample)
        print(f"{t_s:7.0f} {sample.get('rss_mb', float('nan')):8.1f} {sample.get('rss_anon_mb', float('nan')):8.1f} "
              f"{sample.get('rss_file_mb', float('nan')):7.1f} {sample.get('in_use_mb', 0):8.1f} "
              f"{sample.get('free_mb', 0):8.1f} {sample.get('mapped_mb', 0):8.1f} {sample['qps']:7.1f} "
              f"{sample['mean_batch'] or 0:6.1f} {errors:6d}", flush=True)  # fmt: skip

    await sampled_closed_loop(url, questions, clients, minutes, sample_s, on_sample)
    return samples


def verdict(samples: list[dict], warmup_s: float, key: str = "rss_mb") -> dict:
    """``key`` (RSS by default) after the warm-up: first, last, max, the slope of a least-squares line (MB per
    minute) and the means of whole 10-minute windows."""
    kept = [s for s in samples if s["t_s"] >= warmup_s and key in s]
    if len(kept) < 2:
        return {}
    t = np.array([s["t_s"] for s in kept]) / 60
    rss = np.array([s[key] for s in kept])
    slope = float(np.polyfit(t, rss, 1)[0])
    # RSS swings by tens of MB between malloc trims, so one sample against another can mislead: also the mean of
    # each whole 10-minute window after the warm-up
    window = ((t - t[0]) // 10).astype(int)
    means = [float(rss[window == w].mean()) for w in range(int(window.max()) + 1) if (window == w).sum() > 1]
    if means and (t[-1] - t[0]) % 10 < 5:
        means = means[:-1]  # a last window under half full
    return {"first_mb": float(rss[0]), "last_mb": float(rss[-1]), "max_mb": float(rss.max()),
            "growth_pct": float(100 * (rss[-1] - rss[0]) / rss[0]), "slope_mb_per_min": slope,
            "ten_minute_means_mb": means, "mean_qps": float(np.mean([s["qps"] for s in kept]))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    own, flags = split_server_flags(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Flags after -- go to the server.")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--sample_s", type=float, default=10.0)
    p.add_argument("--warmup_min", type=float, default=2.0, help="minutes left out of the verdict")
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the server's --num_threads")
    p.add_argument("--json", type=Path, help="also write the samples and the verdict as JSON here")
    args = p.parse_args(own)

    corpus, npy, _, kind = prepare(args.passages, "auto")
    questions = toy_questions(corpus)
    proc, url = start_server(corpus, npy, "torch", True, args.threads, *flags)
    now = datetime.now(timezone.utc)
    cpu = f"{os.cpu_count()} CPUs ({cpu_name()})"
    env = "".join(f", {k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(("MALLOC_", "ONEDNN_")))
    shown = f", server flags: {shlex.join(flags)}" if flags else ""
    print(f"# retriever soak: {args.passages:,} passages ({kind} vectors), C={args.clients}, {args.minutes:g} min"
          f"{shown}{env}, {cpu}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    try:
        samples = asyncio.run(soak(url, questions, args.clients, args.minutes, args.sample_s))
    finally:
        proc.terminate()
        proc.wait(30)
    result = verdict(samples, args.warmup_min * 60)
    # the process's own memory alone (a leak shows here), without the mapped files' pages (libraries, weights, the
    # corpus), which grow as more of those files is read
    anon = verdict(samples, args.warmup_min * 60, key="rss_anon_mb")
    for name, v in (("RSS", result), ("RSS anonymous", anon)):
        if v:
            print(f"# after {args.warmup_min:g} min warm-up: {name} {v['first_mb']:.1f} -> {v['last_mb']:.1f} MB "
                  f"({v['growth_pct']:+.2f}%), max {v['max_mb']:.1f} MB, fitted slope {v['slope_mb_per_min']:+.2f} "
                  f"MB/min, {v['mean_qps']:.0f} q/s; 10-minute means: "
                  + (" -> ".join(f"{m:.1f}" for m in v["ten_minute_means_mb"]) + " MB" if v["ten_minute_means_mb"]
                     else "none (under 10 minutes)"))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "verdict": result, "verdict_anon": anon}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
