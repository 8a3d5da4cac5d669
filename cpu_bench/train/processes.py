"""Child processes of ``make train``: each stage runs in its own session, logged to a file, and its whole process
group (Ray's workers included) is ended when it returns, fails or is interrupted.

Invariant: only process groups this module started are ever signalled (never ``ray stop``, which would end other
users' Ray clusters on a shared machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from cpu_bench.background_server import free_port, wait_until_healthy
from verl_search.errors import VerlSearchError

logger = logging.getLogger(__name__)

#: the checkout ``cpu_bench`` is imported from (the bench is not in the wheel), which holds ``verl_search`` too
CHECKOUT = Path(__file__).resolve().parents[2]


class StageError(VerlSearchError, RuntimeError):
    """A stage's command exited non-zero; the message names the stage and its log."""


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a stage: the checkout first on PYTHONPATH (Ray workers inherit it, so they import
    ``cpu_bench``, and the checkout's ``verl_search`` wins over an installed copy), unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(CHECKOUT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra or {})
    return env


def exit_on_sigterm() -> None:
    """Turn SIGTERM and SIGHUP (``kill``, ``timeout``, a closed terminal, a cancelled CI job) into ``SystemExit``, so
    the ``finally`` blocks below end the stage's and the retriever's process groups instead of orphaning them."""

    def _exit(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def _end_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # Ray's workers may outlive the driver: end the whole group


def _wait(process: subprocess.Popen, watch: Callable[[], None] | None, every: float) -> int:
    while True:
        try:
            code = process.wait(timeout=every if watch else None)
        except subprocess.TimeoutExpired:
            assert watch is not None
            watch()
            continue
        if watch:
            watch()
        return code


def run_stage(
    name: str,
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    *,
    watch: Callable[[], None] | None = None,
    watch_every: float = 5.0,
) -> float:
    """Run ``command`` to completion in its own session with output in ``log_path``; returns seconds taken.

    ``cwd`` (default: the log's folder) receives what the command writes there, e.g. hydra's ``outputs/``.
    ``watch`` is called every ``watch_every`` seconds while it runs and once when it ends (a live progress line).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # the console gets one line; the full command (hundreds of overrides) heads the stage's log
    logger.info("%s: running (log: %s)", name, log_path)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("command: " + shlex.join(command) + "\n\n")
        log.flush()
        process = subprocess.Popen(
            list(command),
            cwd=cwd or log_path.parent,
            env=child_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = _wait(process, watch, watch_every)
        finally:
            _end_group(process)
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise StageError(f"{name} failed with exit code {code}; see {log_path}:\n" + "\n".join(tail))
    return time.monotonic() - started


@contextlib.contextmanager
def retriever(url: str | None, passages: int, log_path: Path, timeout: float = 900.0) -> Iterator[str]:
    """Yield the ``/retrieve`` URL of ``url`` or of an embedded-default retriever started (and stopped) here."""
    if url is not None:
        yield url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        return
    with retrieval_server(["--toy_passages", str(passages)], log_path, timeout=timeout) as base:
        yield base + "/retrieve"


@contextlib.contextmanager
def retrieval_server(
    flags: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None, timeout: float = 900.0
) -> Iterator[str]:
    """Yield the base URL of a retrieval server started (and stopped) here with ``flags``, once it is healthy."""
    port = free_port()
    command = [sys.executable, "-m", "local_dense_retriever.retrieval_server", "--port", str(port), *flags]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, cwd=log_path.parent, env=child_env(env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_healthy(base, process, timeout=timeout, what="retriever")
            yield base
        finally:
            _end_group(process)
