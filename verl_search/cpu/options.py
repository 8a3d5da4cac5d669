"""Options of the CPU rollout backend, read from ``actor_rollout_ref.rollout.engine_kwargs.<backend name>``.

Invariant: unknown keys are an error naming the key. The one seam for tests, ``opening_policy``, names by dotted path
a server subclass to run instead (it forces openings and records events); unset in production, the plain server runs.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from verl_search.errors import CpuRolloutConfigError, validation_text

BACKEND_NAME = "hf_cpu"


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
        description="FOR TESTS: a CpuRolloutServer subclass each replica runs instead (it forces openings and records "
        "events): {path: its dotted path, its settings...}, or the path alone; unset runs the plain server",
    )

    @field_validator("opening_policy", mode="before")
    @classmethod
    def _importable_policy(cls, value: Any) -> Any:
        spec = {"path": value} if isinstance(value, str) else value
        if isinstance(spec, Mapping):  # pydantic names any other type
            if not isinstance(spec.get("path"), str):
                raise ValueError("needs a path: the dotted path of the server class (package.module.attr)")
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
