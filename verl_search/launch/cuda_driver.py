"""Launch check that the installed GPU environment fits this node's NVIDIA driver: the CUDA major the installed torch
was built for (so which flavour of GPU lock it came from), the newest CUDA the driver supports, and the lock to install
when the two disagree.

Invariant: the environment and the driver are only read, through ``ctx.environment``; a driver too old for the
installed torch, or for every lock, is an error; no driver seen (a dry run on a login node) is only a warning.
"""

from __future__ import annotations

from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning
from verl_search.launch.environment import PythonEnvironment
from verl_search.launch.gpu_locks import (
    CUDA_MAJORS,
    MIN_DRIVER,
    ROLLOUT_ENGINES,
    lock_for_driver,
    lock_path,
    torch_cuda,
)
from verl_search.platform_choice import cpu_requested


def installed_cuda(environment: PythonEnvironment) -> str | None:
    """The CUDA major the installed torch was built for; None when torch is missing or built without CUDA."""
    version = environment.version("torch")
    return None if version is None else torch_cuda(version, environment.requires("torch"))


def lock_cuda(ctx: LaunchContext) -> str:
    """The CUDA major of the GPU lock this environment is compared with: the installed torch's, else the one this
    node's driver runs, else the newest."""
    if cuda := installed_cuda(ctx.environment):
        return cuda
    driver = ctx.environment.cuda_driver()
    return (lock_for_driver(driver) if driver else None) or CUDA_MAJORS[-1]


def needs(cuda: str) -> str:
    """The driver a CUDA major's builds need, in words."""
    return f"a driver that supports CUDA {cuda}.0 or newer (>= {MIN_DRIVER[cuda]})"


def check_cuda_driver(ctx: LaunchContext) -> str:
    """The driver runs the installed torch's CUDA build; otherwise name the lock that fits the driver."""
    if cpu_requested() or str(ctx.config.trainer.device) == "cpu":
        return "a CPU run: no NVIDIA driver needed"
    rollout = str(ctx.rollout.name)
    if rollout not in ROLLOUT_ENGINES:
        return f"no GPU lock for rollout {rollout}; not checked"
    python = ctx.environment.python()

    def name(cuda: str) -> str:
        return lock_path(rollout, python, ctx.lock_dir, cuda=cuda).name

    def lock(cuda: str, instead: str = "") -> str:
        return f"{name(cuda)}{instead} (make install-gpu ROLLOUT={rollout} CUDA={cuda})"

    torch = ctx.environment.version("torch")
    built = installed_cuda(ctx.environment)
    if built:
        installed = f"torch {torch} is a CUDA {built} build, as in {name(built)}"
    else:
        installed = f"torch {torch} is not a CUDA build" if torch else "torch is not installed"
    driver = ctx.environment.cuda_driver()
    if driver is None:
        if built is None:
            newest, oldest = CUDA_MAJORS[-1], CUDA_MAJORS[0]
            raise PreflightWarning(
                f"no NVIDIA driver seen (nvidia-smi) and {installed}: where the driver supports CUDA {newest}.0 or "
                f"newer install {lock(newest)}, where it supports {oldest}.x {lock(oldest)}"
            )
        older = [cuda for cuda in CUDA_MAJORS if int(cuda) < int(built)]
        instead = f"; where the driver supports CUDA {older[-1]}.x only, install {lock(older[-1])}" if older else ""
        raise PreflightWarning(f"no NVIDIA driver seen (nvidia-smi); {installed}, which needs {needs(built)}{instead}")
    fits = lock_for_driver(driver)
    if fits is None:
        raise PreflightError(
            f"this node's NVIDIA driver supports CUDA {driver}; every GPU lock needs {needs(CUDA_MAJORS[0])}: upgrade "
            "the driver"
        )
    if built is None:
        raise PreflightWarning(f"{installed}; this node's driver supports CUDA {driver}: install {lock(fits)}")
    if int(built) > int(driver.split(".")[0]):
        raise PreflightError(
            f"{installed}, which needs {needs(built)}, and this node's driver supports CUDA {driver}: install "
            f"{lock(fits, ' instead')}, or upgrade the driver"
        )
    return f"the driver supports CUDA {driver}; {installed}"
