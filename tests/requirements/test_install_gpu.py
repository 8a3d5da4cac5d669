"""requirements/install_gpu.sh (`make install-gpu`) picks the lock for the driver's CUDA version and the interpreter,
and refuses what cannot work, before pip runs. PYTHON is a stand-in interpreter here (it answers pip by printing what it
was asked) and nvidia-smi a stand-in driver on a PATH of its own: nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "requirements" / "install_gpu.sh"
#: the tools install_gpu.sh runs besides python and nvidia-smi
TOOLS = ("sed", "head", "timeout", "basename", "dirname")


def fake_python(tmp_path: Path, version: str = "3.11", glibc: str = "2.36") -> Path:
    """An interpreter that reports ``version`` and ``glibc``, prints the pip commands it is given, and runs any other
    code with the real one."""
    path = tmp_path / "python"
    path.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        f"  *libc_ver*) echo {glibc} ;;\n"
        f"  *version_info*) echo {version} ;;\n"
        '  pip) echo "pip: $*" ;;\n'
        f'  *) exec {sys.executable} "$@" ;;\n'
        "esac\n"
    )
    path.chmod(0o755)
    return path


def driverless_path(tmp_path: Path) -> Path:
    """A PATH folder with the tools the script needs and no nvidia-smi (a machine without a driver)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir


def with_driver(tmp_path: Path, cuda: str | None, driver: str = "535.183.01") -> Path:
    """That folder plus an nvidia-smi whose header reports ``CUDA Version: <cuda>``; with None, the message and status
    of nvidia-smi on a node whose driver is not loaded."""
    bin_dir = driverless_path(tmp_path)
    smi = bin_dir / "nvidia-smi"
    if cuda is None:
        smi.write_text(
            '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
        )
    else:
        header = f"| NVIDIA-SMI {driver}             Driver Version: {driver}   CUDA Version: {cuda}     |"
        smi.write_text(f"#!/bin/sh\necho '+------------------------------------------+'\necho '{header}'\n")
    smi.chmod(0o755)
    return bin_dir


def install(python: Path, rollout: str, bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """The script as `make install-gpu ROLLOUT=<rollout> DRY_RUN=1` runs it, with only ``bin_dir`` on PATH."""
    variables = {**os.environ, "PATH": str(bin_dir), "PYTHON": str(python), "ROLLOUT": rollout, "DRY_RUN": "1", **env}
    return subprocess.run(["/bin/bash", str(SCRIPT)], env=variables, capture_output=True, text=True, timeout=60)


def chosen_lock(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    [pip] = [line for line in result.stdout.splitlines() if line.startswith("pip: ")]
    assert "--dry-run --no-deps" in pip
    return Path(pip.split(" -r ")[1]).name


@pytest.mark.parametrize(
    ("cuda", "lock"),
    [
        ("12.2", "gpu-vllm-cu12-py3.11.txt"),
        ("12.8", "gpu-vllm-cu12-py3.11.txt"),
        ("13.0", "gpu-vllm-cu13-py3.11.txt"),
        ("13.2", "gpu-vllm-cu13-py3.11.txt"),
    ],
)
def test_the_drivers_cuda_version_picks_the_lock(tmp_path, cuda, lock):
    result = install(fake_python(tmp_path), "vllm", with_driver(tmp_path, cuda))
    assert chosen_lock(result) == lock
    assert f"nvidia-smi reports CUDA Version {cuda}: the cu{lock.split('-cu')[1][:2]} lock" in result.stdout


def test_a_driver_older_than_cuda_12_is_refused_with_the_knob(tmp_path):
    result = install(fake_python(tmp_path), "vllm", with_driver(tmp_path, "11.8", driver="520.61.05"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "nvidia-smi reports CUDA Version 11.8; the locks need a driver with CUDA 12.0 or newer (>= 525)" in (
        result.stderr
    )
    assert "CUDA=12|13" in result.stderr
    assert "pip:" not in result.stdout


@pytest.mark.parametrize("driver", ["none", "not loaded"])
def test_without_a_driver_the_knob_is_asked_for(tmp_path, driver):
    bin_dir = driverless_path(tmp_path) if driver == "none" else with_driver(tmp_path, None)
    result = install(fake_python(tmp_path), "sglang", bin_dir)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    seen = "no nvidia-smi on PATH" if driver == "none" else "nvidia-smi printed no 'CUDA Version'"
    assert result.stderr.startswith(f"error: {seen}")
    assert "CUDA=13 (driver >= 580) or CUDA=12 (driver >= 525)" in result.stderr
    assert "make install-gpu ROLLOUT=sglang CUDA=12" in result.stderr


@pytest.mark.parametrize("cuda", ["12", "13"])
def test_the_knob_chooses_without_a_driver(tmp_path, cuda):
    result = install(fake_python(tmp_path, "3.12"), "sglang", driverless_path(tmp_path), CUDA=cuda)
    assert chosen_lock(result) == f"gpu-sglang-cu{cuda}-py3.12.txt"
    assert "DRY_RUN=1:" in result.stdout


def test_the_knob_overrides_the_driver_with_a_warning_when_the_driver_is_older(tmp_path):
    result = install(fake_python(tmp_path), "vllm", with_driver(tmp_path, "12.4"), CUDA="13")
    assert chosen_lock(result) == "gpu-vllm-cu13-py3.11.txt"
    assert "warning: CUDA=13 chosen, but this node's driver supports CUDA 12.4" in result.stderr
    result = install(fake_python(tmp_path), "vllm", with_driver(tmp_path / "new", "13.0"), CUDA="12")
    assert chosen_lock(result) == "gpu-vllm-cu12-py3.11.txt"
    assert "warning" not in result.stderr


def test_an_unknown_cuda_knob_is_refused(tmp_path):
    result = install(fake_python(tmp_path), "vllm", driverless_path(tmp_path), CUDA="11")
    assert result.returncode == 1
    assert "CUDA=11: choose 12 (drivers with CUDA 12.x, >= 525) or 13" in result.stderr


def test_sglang_cu13_on_an_old_glibc_is_refused_with_the_locks_that_fit(tmp_path):
    result = install(fake_python(tmp_path, "3.11", "2.31"), "sglang", with_driver(tmp_path, "13.0"))
    assert result.returncode == 1
    assert (
        "gpu-sglang-cu13-py3.11.txt ships manylinux_2_34 wheels (glibc >= 2.34) and this system has glibc 2.31; "
        "use ROLLOUT=vllm CUDA=13, or ROLLOUT=sglang CUDA=12, or ROLLOUT=vllm CUDA=12"
    ) in result.stderr


def test_vllm_cu12_needs_glibc_2_31_and_names_the_sglang_cu12_lock(tmp_path):
    result = install(fake_python(tmp_path, "3.10", "2.28"), "vllm", with_driver(tmp_path, "12.2"))
    assert result.returncode == 1
    assert (
        "gpu-vllm-cu12-py3.10.txt ships manylinux_2_31 wheels (glibc >= 2.31) and this system has glibc 2.28; "
        "use ROLLOUT=sglang CUDA=12"
    ) in result.stderr
    sglang = install(fake_python(tmp_path, "3.10", "2.28"), "sglang", with_driver(tmp_path / "b", "12.2"))
    assert chosen_lock(sglang) == "gpu-sglang-cu12-py3.10.txt"


def test_a_python_without_a_lock_is_refused(tmp_path):
    result = install(fake_python(tmp_path, "3.9"), "vllm", driverless_path(tmp_path), CUDA="13")
    assert result.returncode == 1
    assert "no lock for Python 3.9" in result.stderr and "use Python 3.10, 3.11 or 3.12" in result.stderr


def test_an_unknown_engine_is_refused(tmp_path):
    result = install(fake_python(tmp_path), "trtllm", driverless_path(tmp_path))
    assert result.returncode == 1
    assert "ROLLOUT=trtllm: choose sglang or vllm" in result.stderr


def test_a_real_install_installs_the_lock_then_the_package(tmp_path):
    result = install(fake_python(tmp_path), "vllm", with_driver(tmp_path, "12.2"), DRY_RUN="0")
    assert result.returncode == 0, result.stderr
    pips = [line for line in result.stdout.splitlines() if line.startswith("pip: ")]
    assert pips == [
        f"pip: -m pip install --no-deps -r {REPO}/requirements/gpu-vllm-cu12-py3.11.txt",
        f"pip: -m pip install --no-deps -e {REPO}",
    ]


def test_make_install_gpu_runs_the_script_with_the_engine_and_the_knobs():
    result = subprocess.run(
        ["make", "-n", "install-gpu", "ROLLOUT=vllm", "CUDA=12", "DRY_RUN=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "ROLLOUT=vllm" in result.stdout and "CUDA=12" in result.stdout and "DRY_RUN=1" in result.stdout
    assert "requirements/install_gpu.sh" in result.stdout
