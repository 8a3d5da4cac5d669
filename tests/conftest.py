"""Suite-wide: the tests that run verl's trainer end to end (minutes each) go first; Ray keeps its files in a folder
of the test process's own, removed at the end; fixtures for the tests of the CPU backend's bridges over verl.

`make test` runs the suite on two pytest-xdist workers, one test file at a time per worker, in collection order
(`--no-loadscope-reorder`: xdist would otherwise start the files with the most tests first, and these files hold one
each). Started last, a trainer test leaves one worker running alone for its last minutes; started first, the two
workers finish together. Order does not change what any test checks.

Every Ray a test starts (in process, or in a server or trainer it launches) writes a session folder of logs and
sockets, 2-3 MB, under ``$RAY_TMPDIR/ray`` (default ``/tmp/ray``), and never removes it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: the fixture that launches verl's trainer (tests/verl_search/cpu/conftest.py)
TRAINER_FIXTURE = "launch_cpu_run"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: TRAINER_FIXTURE not in getattr(item, "fixturenames", ()))  # stable: else as collected


_ray_root: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Ray's folder in a new temporary one for this test process and what it launches (a short path: Ray's Unix
    sockets live under it, and a socket's path is limited to 107 bytes)."""
    global _ray_root
    if "RAY_TMPDIR" not in os.environ:
        _ray_root = Path(tempfile.mkdtemp(prefix="vs-ray-"))
        os.environ["RAY_TMPDIR"] = str(_ray_root)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _ray_root is not None:
        shutil.rmtree(_ray_root, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The project's local tokenizer (Qwen2.5 chat markup), built once per session (the wheel's tests and the CPU
    test bench's both use it)."""
    from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir

    return ensure_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture
def cpu_platform():
    """verl's current platform is the CPU backend's for the test."""
    from verl.plugin.platform import platform_manager, set_platform

    from verl_search.cpu.platform import CpuPlatform

    saved = platform_manager._current_platform
    set_platform(CpuPlatform())
    yield
    platform_manager._current_platform = saved


@pytest.fixture
def recorded_backend(monkeypatch):
    """torch's init_process_group replaced by a recorder (torch is not ours; we only observe what verl asks of it)."""
    import torch.distributed

    seen: list[str] = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend=None, **kw: seen.append(backend))
    return seen
