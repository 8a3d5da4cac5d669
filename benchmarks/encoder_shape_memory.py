"""The C heap of a CPU encoder fed batches of every size, with and without the padding of shapes.

    python benchmarks/encoder_shape_memory.py              # --encoder_shape_multiple 1 and 8, bfloat16 where fast
    python benchmarks/encoder_shape_memory.py --multiples 4

Each setting runs in a fresh process: 2,000 batches of 1-64 random toy questions through the server's encoder
(``HFEncoder.encode``), the heap trimmed and read (glibc's ``in_use``, local_dense_retriever/memory.py) every 400
batches. oneDNN compiles and caches kernels per input shape (rows x padded tokens); padding every forward pass to a
multiple of 8 in both leaves a few shapes.
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

BATCHES = 2_000
EVERY = 400


def run(multiple: int, dtype: str) -> None:
    import torch
    from retriever_load import toy_questions

    from local_dense_retriever.config import default_cache_dir
    from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path
    from local_dense_retriever.memory import heap_stats, release_free_memory
    from local_dense_retriever.toy.corpus import generate_toy_dataset

    torch.set_num_threads(os.cpu_count() or 1)
    ds = generate_toy_dataset(default_cache_dir() / "toy-100000", 100_000, seed=0)
    questions = toy_questions(ds.corpus_path)
    encoder = HFEncoder(bundled_minilm_path(), dtype=dtype, shape_multiple=multiple)
    rng = random.Random(0)
    t0, heap = time.perf_counter(), []
    for i in range(1, BATCHES + 1):
        encoder.encode(rng.sample(questions, rng.randint(1, 64)))
        if i % EVERY == 0:
            release_free_memory()
            stats = heap_stats()
            heap.append(f"{stats['in_use'] / 2**20:.0f}" if stats else "n/a")
    print(f"shapes x{multiple} ({encoder.dtype}): in_use MB every {EVERY} batches {', '.join(heap)}; "
          f"{time.perf_counter() - t0:.1f} s for {BATCHES} batches", flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 8], help="settings compared (default 1 8)")
    p.add_argument("--multiple", type=int, help="run one setting in this process (what the parent spawns)")
    args = p.parse_args()
    if args.multiple is not None:
        run(args.multiple, args.dtype)
        return 0
    now = datetime.now(timezone.utc)
    print(f"# encoder shape memory: all-MiniLM-L6-v2, {BATCHES} batches of 1-64 toy questions, {os.cpu_count()} CPUs "
          f"({platform.machine()}), {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    for multiple in args.multiples:
        cmd = [sys.executable, __file__, "--multiple", str(multiple), "--dtype", args.dtype]
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
