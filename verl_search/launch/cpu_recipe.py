"""The CPU recipe's knobs as Python checks them, and the overrides ``run_tiny_search_cpu.sh`` cannot write literally:
the trainer mode, the logical GPUs Ray places the trainer's ranks and a separate rollout pool on, the engine's context
length (prompt plus response) and a resume from ``RESUME_FROM``.

Invariant: each knob's default and meaning are declared once, in the script; this model holds only types and bounds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from verl_search.launch.run_outputs import resume_overrides
from verl_search.launch.script_knobs import TrainingKnobs
from verl_search.launch.trainer_mode import settings_from_env, trainer_note, trainer_overrides


class CpuKnobs(TrainingKnobs):
    """Every knob of the CPU script; the environment variable is the field name in capitals."""

    agent_check: int = Field(ge=0, le=1)
    rollout: Literal["hf_cpu", "vllm", "sglang"]
    n_ranks: int = Field(ge=1)
    micro_batch: int = Field(ge=1)
    total_steps: int | None = Field(ge=1)
    resume_mode: str = Field(min_length=1)
    ray_num_cpus: int = Field(ge=1)
    vllm_kv_cache_bytes: int = Field(ge=1)
    vllm_bucket_mb: int = Field(ge=1)
    sglang_kv_tokens: int = Field(ge=1)

    @field_validator("total_steps", mode="before")
    @classmethod
    def _null_steps(cls, steps: object) -> object:
        return None if steps == "null" else steps

    @property
    def expected_agent(self) -> str | None:
        return self.agent if self.agent_check else None


def derived_overrides(knobs: CpuKnobs, env: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """The overrides Python adds to the script's literal ones, and a note on the trainer mode for the user."""
    settings = settings_from_env(env)
    sizes = {"train_batch_size": knobs.train_batch_size, "mini_batch_size": knobs.ppo_mini_batch_size}
    trainer = trainer_overrides(settings, devices=knobs.n_ranks, device="cpu", **sizes)
    # logical GPUs: the trainer's ranks, plus a separate rollout pool's (TRAINER=one_step_off|fully_async)
    rollout_gpus = (settings.rollout_gpus or knobs.n_ranks) if settings.separate else 0
    added = [*trainer, f"+ray_kwargs.ray_init.num_gpus={knobs.n_ranks + rollout_gpus}"]
    if knobs.rollout != "hf_cpu":
        added.append(f"actor_rollout_ref.rollout.max_model_len={knobs.max_prompt_length + knobs.max_response_length}")
    return [*added, *resume_overrides(knobs.resume_from)], [trainer_note(settings)]
