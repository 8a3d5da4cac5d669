"""The C heap of a CPU encoder fed batches of every size, with and without shape padding and a kernel cache bound.

    python benchmarks/encoder_shape_memory.py              # --encoder_shape_multiple 1 and 8, bfloat16 where fast
    python benchmarks/encoder_shape_memory.py --multiples 4
    python benchmarks/encoder_shape_memory.py --multiples 4 --kernel_caches default 64 --queries varied

Each setting runs in a fresh process: 2,000 batches of 1-64 random queries through the server's encoder
(``HFEncoder.encode``), the heap trimmed and read (glibc's ``in_use``, local_dense_retriever/memory.py) every 400
batches. oneDNN compiles and caches kernels per input shape (rows x padded tokens); padding every forward pass to a
multiple of 8 in both leaves a few shapes; ``--encoder_kernel_cache`` bounds how many kernels stay cached
(``default``: torch's own capacities, 1024 each). Queries: ``toy``, the toy questions (two lengths, padded); ``varied``,
3-40 words drawn from them, so the padded length varies as real queries' does.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_dense_retriever.memory import KERNEL_CACHE_VARIABLES  # noqa: E402

BATCHES = 2_000
EVERY = 400


def run(multiple: int, dtype: str, kernel_cache: str, queries: str) -> None:
    import torch
    from retriever_load import toy_questions

    from local_dense_retriever.config import default_cache_dir
    from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path
    from local_dense_retriever.memory import heap_stats, release_free_memory
    from local_dense_retriever.toy.corpus import generate_toy_dataset

    torch.set_num_threads(os.cpu_count() or 1)
    ds = generate_toy_dataset(default_cache_dir() / "toy-100000", 100_000, seed=0)
    questions = toy_questions(ds.corpus_path)
    cache = None if kernel_cache == "default" else int(kernel_cache)
    encoder = HFEncoder(bundled_minilm_path(), dtype=dtype, shape_multiple=multiple, kernel_cache=cache)
    rng = random.Random(0)
    words = sorted({w for q in questions for w in q.split()})

    def query() -> str:
        return " ".join(rng.choices(words, k=rng.randint(3, 40))) if queries == "varied" else rng.choice(questions)

    t0, heap = time.perf_counter(), []
    for i in range(1, BATCHES + 1):
        encoder.encode([query() for _ in range(rng.randint(1, 64))])
        if i % EVERY == 0:
            release_free_memory()
            stats = heap_stats()
            heap.append(f"{stats['in_use'] / 2**20:.0f}" if stats else "n/a")
    print(f"shapes x{multiple}, kernel cache {kernel_cache} ({encoder.dtype}, {queries} queries): in_use MB every "
          f"{EVERY} batches {', '.join(heap)}; {time.perf_counter() - t0:.1f} s for {BATCHES} batches",
          flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 8], help="settings compared (default 1 8)")
    p.add_argument("--kernel_caches", nargs="+", default=["default"], help="settings compared: entries or 'default'")
    p.add_argument("--queries", choices=["toy", "varied"], default="toy")
    p.add_argument("--multiple", type=int, help="run one setting in this process (what the parent spawns)")
    p.add_argument("--kernel_cache", default="default", help="that setting's kernel cache (what the parent spawns)")
    args = p.parse_args()
    if args.multiple is not None:
        run(args.multiple, args.dtype, args.kernel_cache, args.queries)
        return 0
    now = datetime.now(timezone.utc)
    print(f"# encoder shape memory: all-MiniLM-L6-v2, {BATCHES} batches of 1-64 {args.queries} queries, "
          f"{os.cpu_count()} CPUs ({platform.machine()}), {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_VARIABLES}  # "default": torch's own
    for multiple in args.multiples:
        for cache in args.kernel_caches:
            cmd = [sys.executable, __file__, "--multiple", str(multiple), "--kernel_cache", cache, "--dtype",
                   args.dtype, "--queries", args.queries]  # fmt: skip
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
