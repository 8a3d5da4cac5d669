"""The gaps between verl 0.9's SGLang rollout, SGLang 0.5.12 and a CPU that the CPU backend bridges
(verl_search/cpu/sglang_gaps.py): the upstream behaviour is still there (these fail when verl or SGLang change under
us, so the bridges get re-checked), and the bridges do what they claim.

The bridge logic runs everywhere; the upstream checks need the CPU SGLang route (``make install-sglang-cpu``, then
``.venv-sglang/bin/python -m pytest tests/verl_search/cpu/test_sglang_gaps.py``) and skip without it. Each upstream
check runs in a fresh interpreter of that venv, where the start-up hook has applied every bridge, and takes away the
one it checks.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from verl_search.cpu import sglang_gaps
from verl_search.errors import UnsupportedSglangError

REPO = Path(__file__).resolve().parents[3]

needs_sglang = pytest.mark.sglang_cpu  # skipped where SGLang is not installed (conftest)

WITHOUT_STAND_IN = (
    "import sys\n"
    "from verl_search.cpu import sglang_gaps as gaps\n"
    "from verl_search.cpu.stand_ins import StandIns\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, StandIns)]\n"
    "kept = {{k: v for k, v in gaps.STAND_INS.items() if k != {package!r}}}\n"
    "sys.meta_path.insert(0, StandIns(kept, before=gaps.prime_transformers))\n"
)
WITHOUT_HOOK = "import sys\nsys.meta_path[:] = [f for f in sys.meta_path if getattr(f, 'name', None) != {module!r}]\n"


def _python(code: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, input=stdin, timeout=300)


def test_only_the_checked_sglang_is_bridged():
    assert sglang_gaps.check_sglang_version("0.5.12") == "0.5.12"
    with pytest.raises(UnsupportedSglangError, match=r"sglang 0\.5\.13 is installed.*0\.5\.12 only"):
        sglang_gaps.check_sglang_version("0.5.13")


def test_nothing_is_applied_without_sglang():
    if any(d.metadata["Name"] == "sglang" for d in metadata.distributions()):
        pytest.skip("checks an environment without sglang")
    assert sglang_gaps.installed_sglang_without_torchvision() is None
    assert sglang_gaps.apply() is False


def test_a_cpu_tensor_travels_by_value_and_any_process_rebuilds_it():
    import torch

    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1:]  # a strided view: only its values travel
    rebuild, args = sglang_gaps.by_value(tensor)
    assert rebuild.__module__ == "torch.storage"  # SGLang's unpickler allows torch.* only
    payload = pickle.dumps((rebuild, args))
    code = (
        "import pickle, sys, torch\n"
        "rebuild, args = pickle.loads(sys.stdin.buffer.read())\n"
        "sys.stdout.write(repr(rebuild(*args).tolist()))\n"
    )
    result = _python(code, stdin=payload)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout.decode() == repr(tensor.tolist())


# --- gap 1: the absent packages' stand-ins ----------------------------------------------------------------------


@needs_sglang
@pytest.mark.parametrize("package", sorted(sglang_gaps.STAND_INS))
def test_sglang_still_imports_each_absent_package_at_import_time(package):
    for importer in sorted(sglang_gaps.STAND_INS[package]):
        result = _python(WITHOUT_STAND_IN.format(package=package) + f"import {importer}\n")
        assert result.returncode != 0, f"{importer} imports without {package}: drop it from STAND_INS"
        assert f"No module named '{package}" in result.stderr.decode(), result.stderr.decode()[-2000:]


@needs_sglang
def test_with_the_bridges_sglangs_engine_imports_and_no_stand_in_is_left():
    code = (
        "import importlib.util, sys\n"
        "import sglang.srt.entrypoints.engine, sglang.srt.managers.scheduler\n"
        "from transformers.utils import is_torchvision_available\n"
        "left = [n for n in sys.modules if n.split('.')[0] in ('torchvision', 'sgl_kernel')]\n"
        "print(left, importlib.util.find_spec('torchvision'), is_torchvision_available())\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert result.stdout.decode().split("\n")[-2] == "[] None False"


# --- gap 2: image processors without torchvision --------------------------------------------------------------


@needs_sglang
def test_sglang_still_registers_image_processors_that_transformers_serves_only_with_torchvision():
    code = WITHOUT_HOOK.format(module=sglang_gaps.CONFIGS_UTILS_MODULE) + "import sglang.srt.configs\n"
    result = _python(code)
    assert result.returncode != 0, "sglang.srt.configs imports without the bridge: drop gap 2"
    assert "requires the Torchvision library" in result.stderr.decode(), result.stderr.decode()[-2000:]


# --- gap 3: SGLang's CPU engine switch ------------------------------------------------------------------------


@needs_sglang
def test_sglang_still_needs_its_cpu_switch_and_verl_still_sets_it_only_while_importing():
    no_device = (
        "import os\nos.environ.pop('SGLANG_USE_CPU_ENGINE')\n"
        "from sglang.srt.utils.common import get_device\nget_device()\n"
    )
    result = _python(no_device)
    assert result.returncode != 0 and "No accelerator" in result.stderr.decode(), result.stderr.decode()[-2000:]
    loaded = (
        "import os\nos.environ['VERL_PLATFORM'] = 'cpu'\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "RolloutReplicaRegistry.get('sglang')\n"
        "print(os.environ.get('SGLANG_USE_CPU_ENGINE'))\n"
    )
    result = _python(loaded)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert result.stdout.decode().split("\n")[-2] == "None", "verl keeps SGLANG_USE_CPU_ENGINE now: drop gap 3"


@needs_sglang
def test_with_the_bridge_every_process_has_the_switch():
    result = _python("import os\nprint(os.environ['SGLANG_USE_CPU_ENGINE'])\n", env={"SGLANG_USE_CPU_ENGINE": ""})
    assert result.returncode == 0
    # an empty value stays as the user set it; unset, the start-up hook sets "1"
    assert result.stdout.decode().split("\n")[-2] == ""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['SGLANG_USE_CPU_ENGINE'])"],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split("\n")[-2] == "1", done.stderr[-2000:]


# --- gap 4: the weight sync's tensor reduction ----------------------------------------------------------------

SERIALIZE = (
    "import sys, torch\n"
    "from sglang.srt.utils import MultiprocessingSerializer\n"
    "from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions\n"
    "monkey_patch_torch_reductions()\n"
    "sys.stdout.buffer.write(MultiprocessingSerializer.serialize([('w', torch.arange(6.0).reshape(2, 3))]))\n"
)


@needs_sglang
def test_sglangs_patched_reduction_still_fails_on_a_cpu_tensor():
    result = _python(WITHOUT_HOOK.format(module=sglang_gaps.PATCH_TORCH_MODULE) + SERIALIZE)
    assert result.returncode != 0, "SGLang's reduction takes CPU tensors now: drop gap 4"
    assert "IndexError" in result.stderr.decode(), result.stderr.decode()[-2000:]


@needs_sglang
def test_with_the_bridge_sglangs_own_unpickler_rebuilds_the_weights_in_another_process():
    sent = _python(SERIALIZE)
    assert sent.returncode == 0, sent.stderr.decode()[-2000:]
    code = (
        "import sys\n"
        "from sglang.srt.utils import MultiprocessingSerializer\n"
        "[(name, tensor)] = MultiprocessingSerializer.deserialize(sys.stdin.buffer.read())\n"
        "print(name, tensor.tolist())\n"
    )
    received = _python(code, stdin=sent.stdout)
    assert received.returncode == 0, received.stderr.decode()[-2000:]
    assert received.stdout.decode().split("\n")[-2] == "w [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"


def test_the_by_value_payload_is_plain_bytes():
    import torch

    _, (data,) = sglang_gaps.by_value(torch.ones(2))
    assert isinstance(data, bytes) and torch.load(io.BytesIO(data)).tolist() == [1.0, 1.0]
