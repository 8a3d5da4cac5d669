"""The CPU SFT launcher's bridge: verl's SFT trainer still builds the duplicate ``cpu:gloo,cpu:gloo`` backend on a
CPU platform (this fails when verl changes, so the bridge gets re-checked), and the bridge asks for gloo once."""

from __future__ import annotations

import pytest

from cpu_bench.train import sft_cpu
from verl_search.errors import UnsupportedVerlError


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
    ranks = sft_cpu.cpu_torchrun_process_group_init(_verl_torchrun_original())()
    assert recorded_backend == ["cpu:gloo"] and ranks == (0, 0, 1)


def test_the_sft_bridge_is_bound_once_and_refuses_an_unchecked_verl(monkeypatch):
    import importlib.metadata
    import types

    module = types.SimpleNamespace(initialize_global_process_group=_verl_torchrun_original())
    sft_cpu.bridge_torchrun_process_group(module)
    bound = module.initialize_global_process_group
    sft_cpu.bridge_torchrun_process_group(module)
    assert module.initialize_global_process_group is bound and bound.__verl_search_bridge__
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0")
    with pytest.raises(UnsupportedVerlError, match="verl 0.10.0"):
        sft_cpu.bridge_torchrun_process_group(types.SimpleNamespace(initialize_global_process_group=bound))
