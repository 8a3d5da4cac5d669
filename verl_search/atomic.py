"""Atomic file writes: write to a temporary name in the target's folder, rename on success, delete on failure; and
the removal of temporaries that a killed writer (SIGKILL, OOM, power loss) could not delete.

Invariant: every temporary is named ``.<target name>.tmp-<pid>-<random>`` after the process that writes it, so a later
run can tell a stale one (its pid is no longer alive on this machine) from one another live process is writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")


def temporary_name(target: Path) -> Path:
    """A fresh temporary path beside ``target`` that names this process."""
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        pass
    return True


def remove_stale_temporaries(folder: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Delete (and return) the temporaries in ``folder`` (of the targets ``names``, else of any) whose writer is dead
    (only this machine's pids can be checked)."""
    folder = Path(folder)
    wanted = None if names is None else set(names)
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _TEMPORARY.match(path.name)
        if not match or (wanted is not None and match["name"] not in wanted) or _alive(int(match["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            _remove(path)
            removed.append(path)
    if removed:
        logger.warning("removed temporaries of killed runs in %s: %s", folder, ", ".join(p.name for p in removed))
    return removed


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` for the caller to create a file (or folder) at; on clean exit it
    replaces ``target`` (a folder only a missing one), else it is removed. Killed writers' temporaries go first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target.parent, [target.name])
    tmp = temporary_name(target)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@contextlib.contextmanager
def exclusive(lock_path: Path, what: str) -> Iterator[None]:
    """Run the block holding an exclusive ``flock`` on ``lock_path`` (created if missing), so processes building the
    same ``what`` take turns; the lock dies with its holder, so a killed builder never blocks the next."""
    import fcntl

    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building %s", what)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield
