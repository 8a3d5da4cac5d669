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
from verl_search.launch.script_knobs import ResumableKnobs
from verl_search.launch.trainer_mode import settings_from_env, trainer_note, trainer_overrides


class GpuKnobs(ResumableKnobs):
    """Every knob of the GPU script; the environment variable is the field name in capitals."""

    model_path: str = Field(min_length=1)
    data_dir: str
    train_data: str = Field(min_length=1)
    val_data: str = Field(min_length=1)
    tool_config: str = Field(min_length=1)
    retriever_url: str = Field(min_length=1)
    retriever: Literal["url", "serve"]
    agent: Literal["tool_agent", "search_r1_agent"]
    agent_loop_config: str
    max_turns: int = Field(ge=1)
    max_tool_response_length: int = Field(ge=1)
    reward_fn_path: str = Field(min_length=1)
    rollout: Literal["sglang", "vllm"]
    attn_implementation: str = Field(min_length=1)
    n_gpus: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    train_batch_size: int = Field(ge=1)
    val_batch_size: int = Field(ge=1)
    shuffle: int = Field(ge=0, le=1)
    ppo_mini_batch_size: int = Field(ge=1)
    micro_batch_per_gpu: int = Field(ge=1)
    rollout_n: int = Field(ge=1)
    lr: float = Field(gt=0)
    lr_warmup_ratio: float = Field(ge=0, le=1)
    kl_coef: float = Field(ge=0)
    max_prompt_length: int = Field(ge=1)
    max_response_length: int = Field(ge=1)
    rollout_tp: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    actor_offload: int = Field(ge=0, le=1)
    dynamic_bsz: int = Field(ge=0, le=1)
    max_token_len_per_gpu: int = Field(ge=1)
    total_epochs: int = Field(ge=1)
    save_freq: int
    test_freq: int
    logger: str = Field(min_length=1)
    project_name: str = Field(min_length=1)
    experiment_name: str = Field(min_length=1)
    run_dir: str = Field(min_length=1)
    resume_from: str


def derived_overrides(knobs: GpuKnobs, env: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """The overrides Python adds to the script's literal ones (attention, trainer mode, resume), and a note on each
    choice for the user."""
    attention, attention_note = attention_overrides(knobs.attn_implementation, knobs.rollout)
    settings = settings_from_env(env)
    sizes = {"train_batch_size": knobs.train_batch_size, "mini_batch_size": knobs.ppo_mini_batch_size}
    trainer = trainer_overrides(settings, devices=knobs.n_gpus, device="cuda", **sizes)
    return [*attention, *trainer, *resume_overrides(knobs.resume_from)], [attention_note, trainer_note(settings)]
