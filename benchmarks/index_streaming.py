"""Index streaming: load a flat index the way the GPU path does (shards filled step by step through one staging
buffer, the file read by offset and never mapped), here into bfloat16 shards on the CPU, and watch host memory.

    python benchmarks/index_streaming.py                 # 2,000,000 x 384 float32 (3.1 GB file)
    python benchmarks/index_streaming.py --rows 200000   # quicker

Each mode runs in a fresh process with a cold page cache for the file (posix_fadvise DONTNEED) while a thread samples
``RssAnon`` and ``RssFile`` every 20 ms. "streamed" is ``TorchFlatIndex.from_file`` (the code a GPU load runs, with
the shards on the CPU); "mapped" is the path GPU loads took before (the file memory-mapped, copied in slices). The
host memory a GPU load needs beyond its shards is the peak anonymous RSS minus the shards (which live in GPU memory
there), plus whatever the file leaves mapped (RssFile).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MB = 2**20


def write_index(path: Path, rows: int, dim: int) -> None:
    """Seeded random unit vectors as a float32 .npy, written in blocks (the writer never holds the whole array)."""
    if path.is_file() and np.load(path, mmap_mode="r").shape == (rows, dim):
        return
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(0)
    for lo in range(0, rows, 1 << 16):
        block = rng.standard_normal((min(rows, lo + (1 << 16)) - lo, dim), dtype=np.float32)
        out[lo : lo + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    out.flush()
    del out


def _status() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                name, kb, _ = line.split()
                fields[name.rstrip(":")] = int(kb) * 1024
    return fields


def drop_cached(path: Path) -> None:
    """Drop ``path``'s pages from the page cache: the next read comes from the disk, as on a fresh machine."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


@contextlib.contextmanager
def rss_peaks(every_s: float = 0.02):
    """``(base, peak)``: this process's ``RssAnon`` and ``RssFile`` on entry, and their highest values while the block
    runs (sampled every ``every_s`` by a thread; ``peak`` is complete once the block exits)."""
    base = _status()
    peak = dict(base)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for k, v in _status().items():
                peak[k] = max(peak[k], v)
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield base, peak
    finally:
        done.set()
        sampler.join()
        for k, v in _status().items():
            peak[k] = max(peak[k], v)


def child(path: Path, mode: str) -> dict:
    """One load in this process; returns seconds and peak memory above the start."""
    import torch

    from local_dense_retriever.index.torch_flat import TorchFlatIndex, read_flat_vectors

    torch.set_num_threads(1)
    drop_cached(path)
    with rss_peaks() as (base, peak):
        t0 = time.perf_counter()
        cpu = torch.device("cpu")
        if mode == "streamed":
            index = TorchFlatIndex.from_file(path, device=cpu, dtype="bfloat16")
        else:
            index = TorchFlatIndex(read_flat_vectors(path), device=cpu, dtype="bfloat16")
        seconds = time.perf_counter() - t0
    shard_bytes = sum(s.numel() * s.element_size() for _, s in index._shards)
    return {"mode": mode, "seconds": seconds, "file_gb": path.stat().st_size / 1e9, "shard_mb": shard_bytes / MB,
            "anon_above_shards_mb": (peak["RssAnon"] - base["RssAnon"] - shard_bytes) / MB,
            "file_mapped_peak_mb": (peak["RssFile"] - base["RssFile"]) / MB}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--dir", type=Path, help="where the index file is written (default: the cache folder)")
    p.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), args.child[1])))
        return 0

    from local_dense_retriever.config import default_cache_dir

    folder = args.dir or default_cache_dir() / "index-streaming"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"random_{args.rows}x{args.dim}.npy"
    t0 = time.perf_counter()
    write_index(path, args.rows, args.dim)
    print(f"# index streaming: {args.rows:,} x {args.dim} float32 ({path.stat().st_size / 1e9:.2f} GB, written or "
          f"found in {time.perf_counter() - t0:.0f} s) into bfloat16 shards, {os.cpu_count()} CPUs "
          f"({platform.machine()}), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")  # fmt: skip
    print(f"{'mode':10} {'seconds':>8} {'GB/s':>6} {'shards MB':>10} {'anon above shards MB':>21} "
          f"{'file mapped MB':>15}")  # fmt: skip
    for mode in ("streamed", "mapped"):
        out = subprocess.run([sys.executable, __file__, "--child", str(path), mode], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode:10} {r['seconds']:8.1f} {r['file_gb'] / r['seconds']:6.2f} {r['shard_mb']:10.0f} "
              f"{r['anon_above_shards_mb']:21.0f} {r['file_mapped_peak_mb']:15.0f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
