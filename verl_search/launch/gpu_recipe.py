"""The GPU recipe's knobs as Python checks them, and the overrides ``run_qwen2.5-3b_instruct_search_multiturn.sh``
cannot write literally: the actor's attention (a probe of the installed FlashAttention-2), the trainer mode and a
resume from ``RESUME_FROM``.

Invariant: each knob's default and meaning are declared once, in the script (``${VAR:-default}`` and its comment);
this model holds only each knob's type and bounds, so a bad value is a :class:`~verl_search.errors.KnobError` naming
it before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from verl_search.launch.attention import attention_overrides
from verl_search.launch.run_outputs import resume_overrides
from verl_search.launch.script_knobs import TrainingKnobs
from verl_search.launch.trainer_mode import settings_from_env, trainer_note, trainer_overrides


class GpuKnobs(TrainingKnobs):
    """Every knob of the GPU script; the environment variable is the field name in capitals."""

    retriever: Literal["url", "serve"]
    rollout: Literal["sglang", "vllm"]
    attn_implementation: str = Field(min_length=1)
    n_gpus: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    val_batch_size: int = Field(ge=1)
    shuffle: int = Field(ge=0, le=1)
    micro_batch_per_gpu: int = Field(ge=1)
    lr_warmup_ratio: float = Field(ge=0, le=1)
    rollout_tp: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    actor_offload: int = Field(ge=0, le=1)
    dynamic_bsz: int = Field(ge=0, le=1)
    max_token_len_per_gpu: int = Field(ge=1)


def derived_overrides(knobs: GpuKnobs, env: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """The overrides Python adds to the script's literal ones (attention, trainer mode, resume), and a note on each
    choice for the user."""
    attention, attention_note = attention_overrides(knobs.attn_implementation, knobs.rollout)
    settings = settings_from_env(env)
    sizes = {"train_batch_size": knobs.train_batch_size, "mini_batch_size": knobs.ppo_mini_batch_size}
    trainer = trainer_overrides(settings, devices=knobs.n_gpus, device="cuda", **sizes)
    return [*attention, *trainer, *resume_overrides(knobs.resume_from)], [attention_note, trainer_note(settings)]
