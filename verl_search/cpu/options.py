"""Options of the CPU rollout backend, read from ``actor_rollout_ref.rollout.engine_kwargs.<backend name>``.

Invariant: unknown keys are an error naming the key. The one seam for tests, ``opening_policy``, names by dotted path
an object the server asks for each request's forced opening and tells what it did; it is unset in production, and
then the server does no work for it (no decode, no fingerprint, no record).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from verl_search.errors import CpuRolloutConfigError, validation_text

BACKEND_NAME = "hf_cpu"


class OpeningPolicy(Protocol):
    """What ``opening_policy`` builds (the test kit's ``cpu_bench.testing.forced_prefix.ForcedOpenings`` is one)."""

    def opening_for(self, prompt_text: str) -> str:
        """The text this request's output must start with ("" for none); the model's own sampling follows it."""
        ...

    def observe(self, event: dict[str, Any]) -> None:
        """One thing the server did (``start``, ``generate``, ``update_weights``), as a JSON-able dict."""
        ...


def resolve(path: str) -> Any:
    """The object a dotted path names: ``package.module.attr`` or ``package.module:attr``."""
    try:
        return pkgutil.resolve_name(path)
    except (ValueError, ImportError, AttributeError) as e:
        raise ValueError(f"{path!r} is not an importable dotted path (package.module.attr): {e}") from e


class CpuRolloutOptions(BaseModel):
    """``engine_kwargs.hf_cpu`` of the rollout config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(32, ge=1, description="requests decoded together in one batch at most")
    batch_window_ms: float = Field(
        5.0, ge=0, description="how long the first request of a batch waits for others that arrive with it"
    )
    max_tokens_per_turn: int | None = Field(
        None, ge=1, description="server-side cap on new tokens per generate call (None: the request's own budget)"
    )
    opening_policy: dict[str, Any] | None = Field(
        None,
        description="FOR TESTS: a policy that forces the opening of some outputs and observes the server, so CI can "
        "exercise the tool path with a random tiny model: {path: dotted path to a factory called as "
        "factory(replica_rank=..., **the other keys)}, or the path alone; unset (the default) forces nothing and "
        "costs nothing",
    )

    @field_validator("opening_policy", mode="before")
    @classmethod
    def _importable_policy(cls, value: Any) -> Any:
        spec = {"path": value} if isinstance(value, str) else value
        if isinstance(spec, Mapping):  # pydantic names any other type
            if not isinstance(spec.get("path"), str):
                raise ValueError("needs a path: the dotted path of the policy's factory (package.module.attr)")
            resolve(spec["path"])
        return spec

    @classmethod
    def from_engine_kwargs(cls, engine_kwargs: Any) -> CpuRolloutOptions:
        raw = (engine_kwargs or {}).get(BACKEND_NAME) or {}
        if isinstance(raw, DictConfig):  # nested values (opening_policy) become plain dicts too
            raw = OmegaConf.to_container(raw, resolve=True)
        try:
            return cls(**dict(raw))
        except ValidationError as e:
            raise CpuRolloutConfigError(
                validation_text(e, f"actor_rollout_ref.rollout.engine_kwargs.{BACKEND_NAME}")
            ) from e

    def build_opening_policy(self, replica_rank: int) -> OpeningPolicy | None:
        """The configured policy, or None when unset (production); bad keyword arguments are a config error naming
        them."""
        if self.opening_policy is None:
            return None
        kwargs = dict(self.opening_policy)
        path = kwargs.pop("path")
        try:
            return resolve(path)(replica_rank=replica_rank, **kwargs)
        except (TypeError, ValueError) as e:
            detail = validation_text(e) if isinstance(e, ValidationError) else str(e)
            raise CpuRolloutConfigError(
                f"actor_rollout_ref.rollout.engine_kwargs.{BACKEND_NAME}.opening_policy ({path}): {detail}"
            ) from e
