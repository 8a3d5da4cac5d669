"""Where the server's CPU time goes (/metrics ``cpu_seconds``): the engine's stages against the whole process.
Invariant: a stage's time is its thread's; native threads (OpenMP workers) run no Python, so theirs is compute
(``native_threads``); the rest is the service's own overhead. Cumulative since start-up."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("encode", "search", "lookup", "rerank")


class StageClock:
    """Cumulative CPU and wall seconds per engine stage, from every thread that runs the engine."""

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
        """``{process, native_threads, encode, search, lookup, rerank}`` CPU seconds and the stages' wall seconds."""
        with self._lock:
            cpu, wall = dict(self.cpu), dict(self.wall)
        return {
            "process": time.process_time(),
            "native_threads": native_threads_cpu(),
            **cpu,
            "wall": wall,
        }


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
