"""Retriever A/B: the batched server of several source trees (e.g. two commits) under the same load, alternated.

    git worktree add /tmp/before 497313b && git worktree add /tmp/after 4871fa9
    python benchmarks/retriever_ab.py before=/tmp/before after=/tmp/after main=.
    python benchmarks/retriever_ab.py off=. on=. --server_flags off='--encoder_shape_multiple 1'   # one flag A/B

Each tree's ``local_dense_retriever/retrieval_server.py`` serves the 100k-passage toy corpus (as ``retriever_load.py``:
random vectors unless the MiniLM index is cached) with the same flags; C closed-loop single-query clients, a
warm-up, then the measured seconds; the trees take turns for ``--rounds`` rounds, so drift of the machine hits all.
Each line also gives the server's CPU per answered query and the share of it in encoding and index search (its
/metrics ``cpu_seconds``, as ``retriever_load.py`` reports them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import retriever_load  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", help="NAME=PATH of a source tree holding local_dense_retriever/")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument(
        "--group",
        type=int,
        default=1,
        help="clients in groups of this many ask the same questions (a GRPO group searching its question verbatim)",
    )
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--encoder_dtype", choices=["auto", "float32", "bfloat16", "int8"], default="auto")
    p.add_argument(
        "--server_flags",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="more server flags for tree NAME, e.g. pad1='--encoder_shape_multiple 1' (the same tree may be named "
        "twice: a=. b=.)",
    )
    args = p.parse_args()
    flags = {name: shlex.split(value) for name, _, value in (f.partition("=") for f in args.server_flags)}
    trees = retriever_load.server_trees(p, args.trees)

    corpus, npy, _, kind = retriever_load.prepare(100_000, "auto")
    questions = retriever_load.toy_questions(corpus)
    now = datetime.now(timezone.utc)
    print(f"# retriever A/B: 100,000 passages ({kind} vectors), batched torch server, C={args.clients} in groups of "
          f"{args.group} asking the same, {args.seconds:g} s each, encoder {args.encoder_dtype}, {args.threads} "
          f"threads, {os.cpu_count()} CPUs ({platform.machine()}), {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    results: dict[str, list[float]] = {name: [] for name in trees}
    shares: dict[str, list[float]] = {name: [] for name in trees}
    for rnd in range(args.rounds):
        for name, server in trees.items():
            server_args = (corpus, npy, "torch", True, args.threads, args.encoder_dtype, *flags.get(name, []))
            with retriever_load.serving(*server_args, server=server) as (_, url):
                detail = httpx.get(f"{url}/health", timeout=10).json()["detail"].split(";")[0]
                res = asyncio.run(
                    retriever_load.closed_loop(url, questions, args.clients, args.seconds, 3.0, group=args.group)
                )
                before, after = res["metrics"]
                batches = max(after["batches_total"] - before["batches_total"], 1)
                batch = (after["queries_total"] - before["queries_total"]) / batches
                repeated = after.get("duplicate_queries_total", 0) - before.get("duplicate_queries_total", 0)
                split = retriever_load.cpu_split(before["cpu_seconds"], after["cpu_seconds"])
                results[name].append(res["qps"])
                shares[name].append(split["compute_share"])
                print(
                    f"round {rnd + 1} {name:>12}: {res['qps']:7.1f} q/s  p50 {res['p50_ms']:6.1f} ms  p99 "
                    f"{res['p99_ms']:6.1f} ms  batch {batch:5.1f}  repeated {repeated / batches:4.1f}  errors "
                    f"{res['errors']}  server CPU/query {1000 * split['process'] / max(res['completed'], 1):.2f} ms, "
                    f"compute {split['compute_share']:.1%}"
                    f"  ({detail})",
                    flush=True,
                )
    first = next(iter(results))
    base = sum(results[first]) / len(results[first])
    for name, qps in results.items():
        mean = sum(qps) / len(qps)
        share = sum(shares[name]) / len(shares[name])
        print(f"mean {name:>12}: {mean:7.1f} q/s ({mean / base:.2f}x {first}), compute {share:.1%} of the server's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
