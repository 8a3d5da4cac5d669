"""Whose memory grows in a soaking retriever: the server under memray (native and Python stacks), growth per stack.

    pip install memray                                   # a tracer, not a dependency of the project
    python benchmarks/heap_trace.py                      # 15 minutes at C = 64, growth after a 3-minute warm-up
    python benchmarks/heap_trace.py --capture F.bin      # analyse a capture again (other --warmup_min, --depth)

The load is the soak's (``retriever_soak.py``: C closed-loop single-query clients, the real CLI on the 100k-passage
toy corpus), with the server started under ``memray run --native``, which records every allocation the process makes
through malloc (and mmap) with its native and Python stack. After the run, for each allocation site (the first
``--depth`` frames of the merged stack that are not the allocator's own), the bytes still allocated at the end of the
warm-up and at the end of the load: the sites whose live bytes grew are printed, largest first. The server's own
``/metrics`` samples (RSS, the C heap in use) are printed as the soak prints them, so the trace can be set against
the curve it explains. The tracer slows the server (to about 70% of the soak's q/s here); what grows per query grows
all the same.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import prepare, start_server, toy_questions  # noqa: E402
from retriever_soak import soak  # noqa: E402

MB = 2**20
#: frames of the allocator itself, left out of a site's name
ALLOCATOR_FRAMES = ("malloc", "calloc", "realloc", "memalign", "posix_memalign", "aligned_alloc", "valloc",
                    "operator new", "mmap", "_PyObject_Malloc", "PyMem_", "_PyMem_", "memray")  # fmt: skip


def site(record, depth: int) -> str:
    """The allocation site: the first ``depth`` frames of its merged stack past the allocator, innermost first."""
    try:
        frames = record.hybrid_stack_trace()
    except (NotImplementedError, RuntimeError):
        frames = record.stack_trace()
    named = [f"{fn} ({Path(file).name}:{line})" for fn, file, line in frames if not fn.startswith(ALLOCATOR_FRAMES)]
    return " <- ".join(named[:depth]) or "<no frames>"


def live_bytes(intervals, snapshot: int) -> tuple[int, int]:
    """Bytes and blocks of ``intervals`` (memray's temporal records) allocated and not yet freed at ``snapshot``."""
    size = count = 0
    for iv in intervals:
        if iv.allocated_before_snapshot <= snapshot and (
            iv.deallocated_before_snapshot is None or iv.deallocated_before_snapshot > snapshot
        ):
            size += iv.n_bytes
            count += iv.n_allocations
    return size, count


def growth_by_site(capture: Path, since_ms: float, until_ms: float, depth: int) -> tuple[dict, int, int]:
    """Live bytes per site at the last memray snapshot before ``since_ms`` and before ``until_ms`` (epoch ms)."""
    import memray

    with memray.FileReader(str(capture)) as reader:
        times = [s.time for s in reader.get_memory_snapshots()]
        first = max(sum(t <= since_ms for t in times) - 1, 0)
        last = max(sum(t <= until_ms for t in times) - 1, first)
        sites: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for record in reader.get_temporal_allocation_records(merge_threads=True):
            before, n_before = live_bytes(record.intervals, first)
            after, n_after = live_bytes(record.intervals, last)
            if before or after:
                row = sites[site(record, depth)]
                row[0] += before
                row[1] += after
                row[2] += n_before
                row[3] += n_after
    return sites, times[first], times[last]


def report(sites: dict, t0_ms: float, t1_ms: float, top: int) -> None:
    before = sum(r[0] for r in sites.values())
    after = sum(r[1] for r in sites.values())
    print(f"# traced live allocations: {before / MB:.1f} MB -> {after / MB:.1f} MB over {(t1_ms - t0_ms) / 60e3:.1f} "
          f"min ({(after - before) / MB:+.1f} MB)")  # fmt: skip
    grown = sorted(sites.items(), key=lambda kv: kv[1][1] - kv[1][0], reverse=True)
    print(f"{'growth MB':>10} {'live MB':>8} {'blocks':>13}  site (innermost first)")
    for name, (b, a, nb, na) in grown[:top]:
        if a <= b:
            break
        print(f"{(a - b) / MB:+10.2f} {a / MB:8.2f} {nb:6d}->{na:<6d}  {name}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--warmup_min", type=float, default=3.0, help="growth is counted from this minute of the load")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--sample_s", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="server torch threads")
    p.add_argument("--depth", type=int, default=6, help="frames that name an allocation site")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--capture", type=Path, help="analyse this capture (with its .times file) instead of running")
    p.add_argument("--out", type=Path, help="where the capture goes (default: a temporary folder)")
    p.add_argument("server_flags", nargs="*", help="extra server flags, after --")
    args = p.parse_args()
    try:
        import memray  # noqa: F401
    except ImportError:
        p.error("memray is not installed: pip install memray")

    if args.capture is None:
        out = args.out or Path(tempfile.mkdtemp(prefix="heap_trace_")) / "server.bin"
        out.parent.mkdir(parents=True, exist_ok=True)
        corpus, npy, _, kind = prepare(100_000, "auto")
        questions = toy_questions(corpus)
        launcher = ("-m", "memray", "run", "--native", "--quiet", "--force", "--output", str(out))
        proc, url = start_server(corpus, npy, "torch", True, args.threads, "auto", *args.server_flags,
                                 launcher=launcher)  # fmt: skip
        now = datetime.now(timezone.utc)
        print(f"# heap trace: 100,000 passages ({kind} vectors), C={args.clients}, {args.minutes:g} min, server flags "
              f"{args.server_flags or 'default'}, {os.cpu_count()} CPUs ({platform.machine()}), {now:%Y-%m-%d %H:%M} "
              f"UTC; capture {out}")  # fmt: skip
        start_ms = time.time() * 1e3
        try:
            asyncio.run(soak(url, questions, args.clients, args.minutes, args.sample_s))
        finally:
            end_ms = time.time() * 1e3
            proc.terminate()
            proc.wait(300)
        out.with_suffix(".times").write_text(f"{start_ms} {end_ms}\n")
        capture = out
    else:
        capture = args.capture
        start_ms, end_ms = map(float, capture.with_suffix(".times").read_text().split())
    sites, t0, t1 = growth_by_site(capture, start_ms + args.warmup_min * 60e3, end_ms, args.depth)
    report(sites, t0, t1, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
