"""The server's own CPU per request, with the engine's cost taken out (a search backend that answers at once).

The front end is HTTP, the body guard, validation, batching and serialisation, in front of that instant engine.

    python benchmarks/front_end_cost.py                                  # this tree, C = 64
    python benchmarks/front_end_cost.py before=/tmp/before main=. --rounds 3 --clients 64 256

On a GPU the encoder and the scan are fast and the server's one interpreter is the bound (benchmarks/RESULTS.md, "The
whole server on a GPU"); this measures that interpreter's work on any machine. Each tree's server is the real app
(``create_app``, the CLI's uvicorn settings) over the toy corpus, with a search backend that returns passages 0..k-1
for every query, so each request still goes through the batcher, the corpus lookup and the JSON answer. The measure
is the server process's CPU per answered request (its /metrics ``cpu_seconds``), which holds up on a busy machine
where q/s does not; the trees take turns every round. Per row: q/s, CPU per request, and its split: the engine's
thread (here nearly all corpus lookup) and everything else (the event loop: HTTP, guard, validation, batching,
serialisation). 1 / (CPU per request) is the most requests per second one core could serve.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
# nothing of local_dense_retriever is imported at module level: the child serving another tree must import that
# tree's package, so the parent's imports (retriever_load, which loads this tree's) happen in main()


def serve(tree: Path, corpus: Path, port: int) -> None:
    """Run ``tree``'s app over ``corpus`` with an instant search backend on 127.0.0.1:``port`` (the child process)."""
    sys.path.insert(0, str(tree))
    import uvicorn

    import local_dense_retriever
    from local_dense_retriever.app import create_app
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.corpus_store import CorpusStore
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.middleware import json_400_protocol

    class InstantSearch:
        """Passages 0..k-1 for every query, score 1: no encoder, no index."""

        def __init__(self, n: int) -> None:
            self._n = n

        def __len__(self) -> int:
            return self._n

        def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
            ids = np.tile(np.arange(k, dtype=np.int64), (len(queries), 1))
            return np.ones(ids.shape, dtype=np.float32), ids

        def describe(self) -> str:
            return "instant search (no encoder, no index)"

    if not Path(local_dense_retriever.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"serving {local_dense_retriever.__file__}, not the tree {tree}")
    store = CorpusStore(corpus, progress=False)
    config = ServerConfig(corpus_path=str(corpus), index_path=str(corpus), topk=3, max_queue=100_000)
    app = create_app(config, engine=RetrievalEngine(InstantSearch(len(store)), store))
    uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            http=json_400_protocol(config.body_timeout_s),
        )  # fmt: skip
    ).run()


def start(tree: Path, corpus: Path) -> tuple[subprocess.Popen, str]:
    from verl_search.testing.background_server import free_port, wait_until_healthy

    port = free_port()
    cmd = [sys.executable, str(HERE), "--serve", str(tree), "--corpus", str(corpus), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url, proc, timeout=120, what=f"server of {tree}")
    return proc, url


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="*", default=["this=."], help="NAME=PATH source trees (default: this one)")
    p.add_argument("--clients", type=int, nargs="+", default=[64])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--passages", type=int, default=2_000, help="toy corpus rows")
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the child: serve this tree
    p.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve is not None:
        serve(args.serve, args.corpus, args.port)
        return 0

    sys.path.insert(0, str(HERE.parent))
    from retriever_load import closed_loop, cpu_split, server_trees, toy_questions  # puts this tree on the path

    from local_dense_retriever.config import default_cache_dir
    from local_dense_retriever.toy.corpus import generate_toy_dataset

    trees = {name: server.parent.parent for name, server in server_trees(p, args.trees).items()}
    ds = generate_toy_dataset(default_cache_dir() / f"toy-{args.passages}", args.passages, seed=0, progress=False)
    questions = toy_questions(ds.corpus_path)
    now = datetime.now(timezone.utc)
    print(f"# front end cost: instant search over {args.passages:,} toy passages, {os.cpu_count()} CPUs "
          f"({platform.processor() or platform.machine()}), {now:%Y-%m-%d %H:%M} UTC; trees: "
          + ", ".join(f"{n}={t}" for n, t in trees.items()))  # fmt: skip
    print(f"{'round':>5} {'tree':12} {'C':>5} {'q/s':>8} {'p99 ms':>8} {'errors':>6} {'CPU/request':>12} "
          f"{'engine thread':>13} {'other':>8}")  # fmt: skip
    per_request: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for name, tree in trees.items():
            proc, url = start(tree, ds.corpus_path)
            try:
                for c in args.clients:
                    res = asyncio.run(closed_loop(url, questions, c, args.seconds, warmup=2.0))
                    before, after = res.pop("metrics")
                    split = cpu_split(before["cpu_seconds"], after["cpu_seconds"])
                    n = max(res["completed"], 1)
                    us = 1e6 * split["process"] / n
                    engine_us = 1e6 * (split["encode"] + split["search"] + split["lookup"]) / n
                    per_request.setdefault((name, c), []).append(us)
                    print(f"{r:>5} {name:12} {c:>5} {res['qps']:>8.0f} {res['p99_ms']:>8.1f} {res['errors']:>6} "
                          f"{us:>9.0f} us {engine_us:>10.0f} us {us - engine_us:>5.0f} us", flush=True)  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
            time.sleep(0.5)
    print("# median CPU per request (1 core's ceiling):")
    names = list(trees)
    for c in args.clients:
        base = float(np.median(per_request[(names[0], c)]))
        for name in names:
            med = float(np.median(per_request[(name, c)]))
            print(f"#   C={c:<5} {name:12} {med:7.0f} us ({1e6 / med:,.0f} requests/s per core), "
                  f"{med / base:.2f}x of {names[0]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
