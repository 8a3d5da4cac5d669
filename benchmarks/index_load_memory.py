"""Peak RSS of loading a float32 flat index on the CPU, per pre-scan and scan layout: what start-up adds to memory.

    python benchmarks/index_load_memory.py [--rows 200000] [--dim 384] [--staging_mb 8 64] [--work_dir DIR]

Writes (once, kept in ``--work_dir``) a faiss IndexFlatIP of random vectors, then loads it in a fresh process per case
as the server does (``index_source`` memory-maps it; ``TorchFlatIndex`` with ``--index_prefilter`` off, bfloat16 or
int8, ``--index_scan_layout`` queries_first, or auto with no probe remembered), and reports how far the process's own
peak RSS (``VmHWM``, anonymous and file-backed pages) rose during the load. The page cache is warm (the file was just
written or read), so this is the memory the process maps, not the disk's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

LOAD = """
import json, sys, time, torch
from pathlib import Path
from local_dense_retriever import cpu_features
from local_dense_retriever.index.torch_flat import TorchFlatIndex, index_source
cpu_features.SLOW_MATMUL_FACTOR = float("inf")  # a named pre-scan loads on any CPU: its memory is what is measured


def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


path, prefilter, layout, staging = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
before, t0 = peak(), time.perf_counter()
index = TorchFlatIndex(index_source(path, torch.device("cpu"), "auto"), device=torch.device("cpu"),
                       prefilter=prefilter, scan_layout=layout, staging_bytes=staging)
print(json.dumps({"grew": peak() - before, "seconds": time.perf_counter() - t0, "describe": index.describe()}))
"""

CASES = [("off", "queries_first"), ("off", "auto"), ("bfloat16", "queries_first"), ("int8", "queries_first")]


def write_index(path: Path, rows: int, dim: int) -> None:
    import faiss

    index = faiss.IndexFlatIP(dim)
    gen = np.random.default_rng(0)
    for lo in range(0, rows, 50_000):
        index.add(gen.standard_normal((min(50_000, rows - lo), dim), dtype=np.float32))
    faiss.write_index(index, str(path))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--staging_mb", type=int, nargs="+", default=[8, 64], help="the copy's step (the server: 64)")
    p.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "index_load_memory")
    args = p.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    path = args.work_dir / f"flat_{args.rows}x{args.dim}.index"
    if not path.exists():
        write_index(path, args.rows, args.dim)
    size = path.stat().st_size
    root = Path(__file__).resolve().parent.parent
    print(
        f"# index load memory: {args.rows:,} x {args.dim} float32 ({size / 1e6:.0f} MB), {os.cpu_count()} CPUs "
        f"({platform.machine()}), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print("| pre-scan | layout | step MB | peak RSS grew, MB | × file | load s | index |")
    print("|---|---|---:|---:|---:|---:|---|")
    for staging in args.staging_mb:
        for prefilter, layout in CASES:
            with tempfile.TemporaryDirectory() as cache:  # 'auto' probes: nothing remembered
                env = {**os.environ, "VERL_SEARCH_CACHE": cache, "PYTHONPATH": str(root)}
                command = [sys.executable, "-c", LOAD, str(path), prefilter, layout, str(staging << 20)]
                out = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=root)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            grew = result["grew"]
            print(f"| {prefilter} | {layout} | {staging} | {grew / 1e6:.0f} | {grew / size:.2f} | "
                  f"{result['seconds']:.2f} | {result['describe']} |")  # fmt: skip


if __name__ == "__main__":
    main()
