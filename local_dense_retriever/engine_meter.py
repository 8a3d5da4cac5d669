"""``EngineMeter``: what the engine's threads push for GET /metrics: CPU and wall seconds per stage, texts repeated in
a batch, queries the index's pre-scan found crowded. Invariants: thread-safe (every thread that runs the engine
writes here); cumulative since start-up. A stage's time is its thread's; native threads (OpenMP workers) run no
Python, so theirs is compute (``native_threads``); the rest of the process's time is the service's own overhead."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("encode", "search", "lookup", "rerank")


class EngineMeter:
    """Cumulative stage seconds and counts, from every thread that runs the engine."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self.wall = dict.fromkeys(STAGES, 0.0)
        self.duplicate_queries = 0  # copies of a text in a batch, encoded and searched once
        self.crowded_queries = 0  # the index's own running count (accel.prescan), as of its last search
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

    def add_duplicates(self, n: int) -> None:
        with self._lock:
            self.duplicate_queries += n

    def set_crowded(self, total: int) -> None:
        self.crowded_queries = total  # one store: the index counts, this keeps its latest total

    def cpu_seconds(self) -> dict:
        """``{process, native_threads, encode, search, lookup, rerank}`` CPU seconds and the stages' wall seconds."""
        with self._lock:
            cpu, wall = dict(self.cpu), dict(self.wall)
        return {"process": time.process_time(), "native_threads": native_threads_cpu(), **cpu, "wall": wall}


def native_threads_cpu() -> float | None:
    """CPU seconds of this process's threads that run no Python; None where ``/proc`` has no per-thread times."""
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
