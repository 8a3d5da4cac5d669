"""Where the server's CPU time goes: the engine's stages (encode, index search, corpus lookup) against the process.

Invariant: a stage's CPU time is the CPU time of the thread that runs it (``time.thread_time``) plus nothing else;
the intra-op threads torch and faiss start (OpenMP workers, tokenizer threads) are native threads that never run
Python, so their whole CPU time is compute and is reported apart as ``native_threads``. What is left of the process
time (``process - encode - search - lookup - native_threads``) is the service's own overhead: HTTP, validation,
batching, bookkeeping, serialisation. Counters are cumulative since start-up (index loading included); compare two
snapshots taken under load.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("encode", "search", "lookup")


class StageClock:
    """Cumulative CPU and wall seconds per engine stage, from every thread that runs the engine (the batcher's one, or
    the per-request mode's pool)."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self.wall = dict.fromkeys(STAGES, 0.0)
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
            with self._lock:
                self.cpu[name] += cpu
                self.wall[name] += wall

    def snapshot(self) -> dict:
        """``{process, native_threads, encode, search, lookup}`` CPU seconds and the stages' wall seconds."""
        with self._lock:
            cpu, wall = dict(self.cpu), dict(self.wall)
        return {
            "process": time.process_time(),
            "native_threads": native_threads_cpu(),
            **cpu,
            "wall": wall,
        }


def native_threads_cpu() -> float | None:
    """CPU seconds of this process's threads that run no Python (torch/faiss OpenMP workers, tokenizer threads);
    None where ``/proc`` has no per-thread times."""
    python = {t.native_id for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        if int(tid) in python:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15)
    return total
