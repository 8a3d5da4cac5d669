"""The hf_cpu rollout options: defaults force nothing; unknown keys and unimportable policies name the key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_search.cpu.options import CpuRolloutOptions
from verl_search.errors import CpuRolloutConfigError


def test_defaults_name_no_opening_policy():
    options = CpuRolloutOptions.from_engine_kwargs(None)
    assert options.opening_policy is None
    assert CpuRolloutOptions.from_engine_kwargs({"vllm": {}}) == options


def test_options_from_verls_config_nodes_round_trip_to_the_server():
    engine_kwargs = OmegaConf.create(
        {"hf_cpu": {"max_tokens_per_turn": 48, "opening_policy": {"path": "collections.Counter", "a": 1}}}
    )
    options = CpuRolloutOptions.from_engine_kwargs(engine_kwargs)
    assert options.max_tokens_per_turn == 48
    assert CpuRolloutOptions(**options.model_dump()) == options  # what the replica sends its server's actor
    assert options.opening_policy == {"path": "collections.Counter", "a": 1}  # plain dicts, the server's settings


@pytest.mark.parametrize(
    ("hf_cpu", "message"),
    [
        ({"test_force_search_every": 2}, "test_force_search_every"),
        ({"record_dir": "/tmp/x"}, "record_dir"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"opening_policy": "no_such_module_xyz.Policy"}, "opening_policy.*no_such_module_xyz"),
        ({"opening_policy": "collections.NoSuchThing"}, "opening_policy.*NoSuchThing"),
        ({"opening_policy": "notadottedpath"}, "opening_policy.*dotted path"),
        ({"opening_policy": {"search_every": 2}}, "opening_policy.*needs a path"),
        ({"opening_policy": 5}, "opening_policy"),
    ],
)
def test_bad_options_are_a_config_error_naming_the_key(hf_cpu, message):
    with pytest.raises(CpuRolloutConfigError, match=message):
        CpuRolloutOptions.from_engine_kwargs({"hf_cpu": hf_cpu})
