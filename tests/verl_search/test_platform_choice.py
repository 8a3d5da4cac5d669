"""``VERL_PLATFORM=cpu`` is read in one place, the same way by the plugin, the CPU registration and the launch check."""

from __future__ import annotations

import pytest

from verl_search.cpu import register
from verl_search.platform_choice import cpu_requested


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"VERL_PLATFORM": "cpu"}, True),
        ({"VERL_PLATFORM": " CPU\n"}, True),
        ({"VERL_PLATFORM": "cuda"}, False),
        ({}, False),
    ],
)
def test_only_the_cpu_platform_selects_the_backend(env, expected):
    assert cpu_requested(env) is expected


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert cpu_requested() and register.requested()
    monkeypatch.delenv("VERL_PLATFORM")
    assert not cpu_requested() and not register.requested()
