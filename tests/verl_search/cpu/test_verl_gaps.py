"""The two verl gaps the CPU backend bridges still exist in the installed verl (these fail when verl changes under
us, so the bridges get re-checked), and the bridges do what they claim."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed

from verl_search.cpu import verl_gaps
from verl_search.errors import UnsupportedVerlError


def _verl_original():
    from verl.utils import distributed

    function = distributed.initialize_global_process_group_ray
    return getattr(function, "__wrapped__", function)


def test_verl_still_builds_the_duplicate_backend_on_a_cpu_platform(cpu_platform, recorded_backend):
    _verl_original()(timeout_second=None)
    assert recorded_backend == ["cpu:gloo,cpu:gloo"]


def test_torch_refuses_the_duplicate_backend(tmp_path):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    with pytest.raises((ValueError, RuntimeError), match="[Dd]uplicate"):
        torch.distributed.init_process_group("cpu:gloo,cpu:gloo", store=store, rank=0, world_size=1)


def test_the_bridge_asks_for_gloo_once(cpu_platform, recorded_backend):
    verl_gaps.cpu_process_group_init(_verl_original())(timeout_second=None)
    assert recorded_backend == ["cpu:gloo"]


def test_the_bridge_keeps_an_explicit_backend(cpu_platform, recorded_backend):
    verl_gaps.cpu_process_group_init(_verl_original())(backend="cpu:gloo")
    assert recorded_backend == ["cpu:gloo"]


def test_verl_fsdp2_engine_still_pins_the_ref_models_offload():
    from verl.workers.engine.fsdp import transformer_impl

    source = inspect.getsource(transformer_impl)
    assert "CPUOffloadPolicy(pin_memory=True)" in source
    assert "from torch.distributed.fsdp" in source or "CPUOffloadPolicy," in source


def test_the_bridged_offload_policy_never_pins():
    from torch.distributed.fsdp import CPUOffloadPolicy

    bridged = verl_gaps.unpinned_offload_policy(CPUOffloadPolicy)
    policy = bridged(pin_memory=True)
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    assert verl_gaps.unpinned_offload_policy(bridged) is bridged


def test_an_unchecked_verl_version_is_refused(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0")
    with pytest.raises(UnsupportedVerlError, match="verl 0.10.0"):
        verl_gaps.check_verl_version()
