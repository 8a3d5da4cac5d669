"""Start-up of the retrieval server on a large faiss flat index: time to /health 200 and peak RSS.

    python benchmarks/flat_index_startup.py --passages 2000000 --work_dir /tmp/flatbench

Writes (once, kept in --work_dir) a corpus of N short rows and a faiss IndexFlatIP of N random 384-d vectors (the
width of the bundled all-MiniLM-L6-v2), then (1) loads the index the way the server did before (faiss.read_index with
IO_FLAG_MMAP to read the header, then a memmap of the vectors) and (2) starts the real CLI on it (header parsed by
hand, vectors memory-mapped), reporting seconds and peak RSS (VmHWM) of each. The page cache is warm in both (the
files were just written or read), so the times are the CPU cost, not the disk's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.encoder import bundled_minilm_path  # noqa: E402
from verl_search.testing.background_server import free_port, wait_until_healthy  # noqa: E402

DIM = 384
OLD_LOADER = """
import sys, time, faiss, numpy as np
from pathlib import Path
t0 = time.perf_counter()
raw = faiss.read_index(sys.argv[1], faiss.IO_FLAG_MMAP)
index = faiss.downcast_index(raw)
n, d = int(index.ntotal), int(index.d)
offset = Path(sys.argv[1]).stat().st_size - n * d * 4
vectors = np.memmap(sys.argv[1], dtype=np.float32, mode="r", offset=offset, shape=(n, d))
del index, raw
t = time.perf_counter() - t0
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1]
print(t, int(hwm) * 1024)
"""


def prepare(work: Path, n: int) -> tuple[Path, Path]:
    import faiss

    work.mkdir(parents=True, exist_ok=True)
    corpus, index_path = work / f"corpus_{n}.jsonl", work / f"flat_{n}.index"
    if not corpus.exists():
        with open(corpus.with_suffix(".tmp"), "w") as f:
            for i in range(n):
                f.write(json.dumps({"id": str(i), "contents": f'"Doc {i}"\nPassage number {i}.'}) + "\n")
        corpus.with_suffix(".tmp").rename(corpus)
    if not index_path.exists():
        index = faiss.IndexFlatIP(DIM)
        gen = np.random.default_rng(0)
        for lo in range(0, n, 100_000):
            x = gen.standard_normal((min(100_000, n - lo), DIM), dtype=np.float32)
            index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
        faiss.write_index(index, str(index_path) + ".tmp")
        del index
        os.replace(str(index_path) + ".tmp", index_path)
    return corpus, index_path


def memory(pid: int) -> str:
    """Peak RSS, and the current RSS split into anonymous memory and mapped file pages (page cache, reclaimable)."""
    with open(f"/proc/{pid}/status") as f:
        kb = {
            k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmHWM", "RssAnon", "RssFile")
        }
    anon, mapped = kb["RssAnon"] / 1e6, kb["RssFile"] / 1e6
    return f"peak RSS {kb['VmHWM'] / 1e6:.2f} GB (now: anonymous {anon:.2f} GB, file-backed {mapped:.2f} GB)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, default=2_000_000)
    p.add_argument("--work_dir", type=Path, default=Path("/tmp/flat_index_startup"))
    args = p.parse_args()
    t0 = time.perf_counter()
    corpus, index_path = prepare(args.work_dir, args.passages)
    size = index_path.stat().st_size
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; {args.passages:,} x {DIM} IndexFlatIP = {size / 1e9:.2f} GB "
          f"(prepared in {time.perf_counter() - t0:.0f} s)")  # fmt: skip
    old = subprocess.run(
        [sys.executable, "-c", OLD_LOADER, str(index_path)], capture_output=True, text=True, check=True
    )
    old_s, old_rss = old.stdout.split()
    print(f"old index load (faiss.read_index IO_FLAG_MMAP + memmap): {float(old_s):.2f} s, "
          f"peak RSS {int(old_rss) / 1e9:.2f} GB")  # fmt: skip
    port = free_port()
    cmd = [sys.executable, "local_dense_retriever/retrieval_server.py", "--index_path", str(index_path),
           "--corpus_path", str(corpus), "--retriever_name", "minilm", "--retriever_model", str(bundled_minilm_path()),
           "--port", str(port)]  # fmt: skip
    # first start builds the corpus offsets table once; time the second, the one users see every day
    for attempt in ("first start (builds the corpus offsets table)", "start"):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)  # fmt: skip
        wait_until_healthy(f"http://127.0.0.1:{port}", proc, timeout=1800)
        ready_s = time.perf_counter() - t0
        mem_ready = memory(proc.pid)
        import httpx

        r = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Passage number 7"]}, timeout=120)
        assert r.status_code == 200, r.text
        mem_query = memory(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        print(f"server {attempt}: healthy after {ready_s:.1f} s; at ready: {mem_ready}; after the first query (a full "
              f"scan maps every vector): {mem_query}; exit status after SIGTERM {rc}")  # fmt: skip


if __name__ == "__main__":
    main()
