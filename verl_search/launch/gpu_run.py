"""The knobs of the GPU recipe (``run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh``: GRPO on
Qwen2.5-3B-Instruct with FSDP and SGLang or vLLM) and the verl overrides they mean; the script evals
``python -m verl_search.launch.gpu_run -- OVERRIDES``.

Invariant: the defaults are the published recipe's wherever verl 0.9.1 accepts them (the README's table lists each
difference); the overrides are derived from validated knobs only.
"""

from __future__ import annotations

import sys
from typing import ClassVar, Literal

from pydantic import Field

from verl_search.launch.run_knobs import RunKnobs, data_overrides, gpu_parts, knobs_main, resume_overrides, value


class GpuRunKnobs(RunKnobs):
    """Every knob of the GPU recipe; the environment variable is the field name in capitals."""

    experiment_prefix: ClassVar[str] = "qwen2.5-3b-instruct-grpo-search"

    model_path: str = Field("Qwen/Qwen2.5-3B-Instruct", description="a model folder or hub id")
    val_data: str = Field(
        "",
        description="default: DATA_DIR/val_subset.parquet, the 500-per-source subsample preprocess_searchR1_dataset.py "
        "writes (the full test set, DATA_DIR/test.parquet, takes ~15x longer per validation)",
    )
    project_name: str = "search_r1_like_async_rl"
    train_batch_size: int = Field(512, ge=1)
    val_batch_size: int = Field(256, ge=1, description="prompts per validation batch")
    shuffle: int = Field(
        0, ge=0, le=1, description="1: shuffle the training rows each epoch; 0 (the published recipe): file order"
    )
    ppo_mini_batch_size: int = Field(256, ge=1)
    rollout_n: int = Field(5, ge=1)
    lr: float = Field(1e-6, gt=0)
    max_prompt_length: int = Field(4096, ge=1)
    max_response_length: int = Field(3000, ge=1)
    max_turns: int = Field(
        2, ge=1, description="assistant turns per trajectory: 2 = one round of searches, then an answer"
    )
    save_freq: int = 100
    test_freq: int = 50
    logger: str = Field(
        '["console","wandb","file"]', description="file: per-step metrics in RUN_DIR/metrics.jsonl (the report's input)"
    )
    retriever: Literal["url", "serve"] = Field(
        "url",
        description="url: use RETRIEVER_URL; serve: start a Ray Serve retriever fleet in verl's Ray cluster first "
        "(RETRIEVER_REPLICAS, RETRIEVER_GPUS, RETRIEVER_CPUS, RETRIEVER_PORT, RAY_ADDRESS; see common.sh)",
    )
    n_gpus: int = Field(8, ge=1, description="GPUs per node")
    nnodes: int = Field(1, ge=1)
    rollout: Literal["sglang", "vllm"] = Field(
        "sglang", description="the rollout engine (each has a locked environment: make install-gpu ROLLOUT=...)"
    )
    attn_implementation: str = Field(
        "auto",
        description="the actor's attention: auto (flash_attention_2 when transformers finds FlashAttention-2, else "
        "sdpa), or any name transformers accepts",
    )
    lr_warmup_ratio: float = Field(0.285, ge=0, le=1)
    rollout_tp: int = Field(1, ge=1, description="the engine's tensor parallelism")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    micro_batch_per_gpu: int = Field(8, ge=1)
    actor_offload: int = Field(
        0, ge=0, le=1, description="1: the actor's parameters and optimizer wait in CPU memory (for GPUs under 80 GB)"
    )
    dynamic_bsz: int = Field(0, ge=0, le=1, description="1: pack micro-batches by tokens (MAX_TOKEN_LEN_PER_GPU)")
    max_token_len_per_gpu: int = Field(
        15000, ge=1, description="the engine's max_model_len, and with DYNAMIC_BSZ=1 the tokens per GPU per micro-batch"
    )


def gpu_overrides(knobs: GpuRunKnobs) -> list[str]:
    """The recipe's verl overrides (FSDP, GRPO with a low-variance KL loss, the published batch sizes)."""
    k = knobs
    actor, ref, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
    offload = value(bool(k.actor_offload))
    dynamic = [f"{actor}.use_dynamic_bsz=True", f"{actor}.ppo_max_token_len_per_gpu={k.max_token_len_per_gpu}"]
    return [
        *data_overrides(k),
        f"data.val_batch_size={k.val_batch_size}",
        f"data.shuffle={value(bool(k.shuffle))}",
        f"actor_rollout_ref.model.path={k.model_path}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        f"{actor}.optim.lr={value(k.lr)}",
        f"{actor}.optim.lr_warmup_steps_ratio={value(k.lr_warmup_ratio)}",
        f"{actor}.ppo_mini_batch_size={k.ppo_mini_batch_size}",
        f"{actor}.ppo_micro_batch_size_per_gpu={k.micro_batch_per_gpu}",
        *(dynamic if k.dynamic_bsz else []),
        f"{actor}.use_kl_loss=True",
        f"{actor}.kl_loss_coef={value(k.kl_coef)}",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.entropy_coeff=0",
        f"{actor}.fsdp_config.param_offload={offload}",
        f"{actor}.fsdp_config.optimizer_offload={offload}",
        f"{ref}.log_prob_micro_batch_size_per_gpu={k.micro_batch_per_gpu}",
        f"{ref}.fsdp_config.param_offload=True",
        f"{rollout}.tensor_model_parallel_size={k.rollout_tp}",
        f"{rollout}.gpu_memory_utilization={value(k.gpu_memory_utilization)}",
        f"{rollout}.max_model_len={k.max_token_len_per_gpu}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={k.micro_batch_per_gpu}",
        f"{rollout}.n={k.rollout_n}",
        "trainer.critic_warmup=0",
        "trainer.val_before_train=False",
        f"trainer.logger={k.logger}",
        f"trainer.project_name={k.project_name}",
        f"trainer.experiment_name={k.experiment_name}",
        f"trainer.n_gpus_per_node={k.n_gpus}",
        f"trainer.nnodes={k.nnodes}",
        f"trainer.save_freq={k.save_freq}",
        f"trainer.test_freq={k.test_freq}",
        f"trainer.total_epochs={k.total_epochs}",
        f"trainer.default_local_dir={k.run_dir}/checkpoints",
        f"trainer.validation_data_dir={k.run_dir}/val_generations",
        *resume_overrides(k.resume_from),
    ]


def compose(knobs: GpuRunKnobs) -> tuple[list[str], list[str]]:
    """The knobs' overrides, then the engine, attention, search and trainer mode (with a note on each choice)."""
    parts, notes = gpu_parts(
        knobs,
        rollout=knobs.rollout,
        attention=knobs.attn_implementation,
        devices=knobs.n_gpus,
        mini_batch_size=knobs.ppo_mini_batch_size,
    )
    return [*gpu_overrides(knobs), *parts], notes


def main(argv: list[str] | None = None) -> int:
    prog, description = "python -m verl_search.launch.gpu_run", __doc__.split("\n")[0]
    return knobs_main(prog, description, GpuRunKnobs, compose, argv)


if __name__ == "__main__":
    sys.exit(main())
