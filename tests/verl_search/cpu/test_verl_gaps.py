"""The three verl gaps the CPU backend bridges still exist in the installed verl (these fail when verl changes under
us, so the bridges get re-checked), and the bridges do what they claim."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed

from verl_search.cpu import verl_gaps
from verl_search.cpu.errors import UnsupportedVerlError


@pytest.fixture
def cpu_platform():
    from verl.plugin.platform import platform_manager, set_platform

    from verl_search.cpu.platform import CpuPlatform

    saved = platform_manager._current_platform
    set_platform(CpuPlatform())
    yield
    platform_manager._current_platform = saved


@pytest.fixture
def recorded_backend(monkeypatch):
    """torch's init_process_group replaced by a recorder (torch is not ours; we only observe what verl asks of it)."""
    seen: list[str] = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend=None, **kw: seen.append(backend))
    return seen


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


def _verl_torchrun_original():
    from verl.utils import distributed

    function = distributed.initialize_global_process_group
    return getattr(function, "__wrapped__", function)


@pytest.fixture
def single_rank(monkeypatch):
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)


def test_verl_sft_trainer_still_builds_the_duplicate_backend_on_a_cpu_platform(
    cpu_platform, recorded_backend, single_rank, monkeypatch
):
    from verl.utils import distributed

    monkeypatch.setattr(distributed, "get_torch_device", lambda: type("D", (), {"set_device": lambda *_: None}))
    _verl_torchrun_original()()
    assert recorded_backend == ["cpu:gloo,cpu:gloo"]


def test_the_sft_bridge_asks_for_gloo_once_and_returns_the_ranks(cpu_platform, recorded_backend, single_rank):
    ranks = verl_gaps.cpu_torchrun_process_group_init(_verl_torchrun_original())()
    assert recorded_backend == ["cpu:gloo"] and ranks == (0, 0, 1)


def test_the_sft_bridge_is_bound_once_and_refuses_an_unchecked_verl(monkeypatch):
    import importlib.metadata
    import types

    module = types.SimpleNamespace(initialize_global_process_group=_verl_torchrun_original())
    verl_gaps.bridge_torchrun_process_group(module)
    bound = module.initialize_global_process_group
    verl_gaps.bridge_torchrun_process_group(module)
    assert module.initialize_global_process_group is bound and bound.__verl_search_bridge__
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0")
    with pytest.raises(UnsupportedVerlError, match="verl 0.10.0"):
        verl_gaps.bridge_torchrun_process_group(types.SimpleNamespace(initialize_global_process_group=bound))
