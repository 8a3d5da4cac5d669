"""The knobs of an evaluation with search (``run_scripts/eval_search.sh``: verl's validation-only mode, greedy, every
generation dumped) and the verl overrides they mean, declared once here on the base the training scripts share.

Invariant: what to evaluate is decided once, by :func:`resolve_checkpoint`: a verl checkpoint (``.../global_step_N``,
or the folder with ``latest_checkpointed_iteration.txt``) resumes the actor on top of ``MODEL_PATH``; a Hugging Face
model folder is the model. ``DEVICE=cuda`` gets the full override set here (FSDP with offload, the engine's memory
share); ``DEVICE=cpu`` hands the run to ``run_tiny_search_cpu.sh`` (its knobs, DESIGN §1.1) and appends only the
evaluation's overrides (:func:`validation_overrides`), which win because they come later.

CLI (what the script calls): ``python -m verl_search.launch.eval_run shell`` prints the resolved knobs as shell
assignments; ``python -m verl_search.launch.eval_run overrides`` prints the overrides, NUL-separated.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from verl_search.errors import VerlSearchError
from verl_search.launch.run_knobs import RunKnobs, absolute, data_overrides, knobs_main, value

#: per device: the engines that run there, the first is the default
ENGINES = {"cuda": ("sglang", "vllm"), "cpu": ("vllm", "hf_cpu")}
#: per device: the defaults that differ (the GPU recipe's model; a CPU needs a model the user names)
DEVICE_DEFAULTS = {
    "cuda": {"MODEL_PATH": "Qwen/Qwen2.5-3B-Instruct", "TRAIN_BATCH_SIZE": "64"},
    "cpu": {"TRAIN_BATCH_SIZE": "4"},
}


class EvalRunError(VerlSearchError, ValueError):
    """A knob of the evaluation has a value it cannot take; the message names the knob."""

    kind = "eval_run"


class EvalRunKnobs(RunKnobs):
    """Every knob of ``eval_search.sh``; the environment variable is the field name in capitals. ``RESUME_MODE`` and
    ``RESUME_FROM`` are derived from ``CHECKPOINT``, never set by hand."""

    experiment_prefix: ClassVar[str] = "eval"
    error: ClassVar[type[ValueError]] = EvalRunError

    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="cuda, or cpu (verl's CPU trainer, run_tiny_search_cpu.sh)"
    )
    model_path: str = Field(
        description="a model folder, e.g. the one the checkpoint was trained from (runs/train/sft/model)"
    )
    checkpoint: str = Field("", description="a verl checkpoint folder or a Hugging Face model folder")
    val_data: str = Field(
        "",
        description="default: DATA_DIR/test.parquet, the full test set (51,713 rows); val_subset.parquet is the "
        "per-source subsample",
    )
    output_dir: str = Field("", description="where the generations go (default: RUN_DIR/generations)")
    project_name: str = "search_r1_like_async_rl"
    rollout: Literal["sglang", "vllm", "hf_cpu"] = Field(
        "sglang", description="cuda: sglang or vllm; cpu: vllm or hf_cpu"
    )
    train_batch_size: int = Field(
        64, ge=1, description="verl builds a training dataloader even in validation-only mode: it reads this many rows"
    )
    max_prompt_length: int = Field(4096, ge=1)
    max_response_length: int = Field(3000, ge=1)
    logger: str = '["console"]'
    n_gpus: int = Field(8, ge=1, description="GPUs per node")
    nnodes: int = Field(1, ge=1)
    attn_implementation: str = Field(
        "auto", description="the actor's attention: auto (flash_attention_2 when flash-attn imports, else sdpa)"
    )
    rollout_tp: int = Field(1, ge=1, description="the engine's tensor parallelism")
    gpu_memory_utilization: float = Field(0.7, gt=0, le=1)
    resume_mode: Literal["disable", "resume_path"] = "disable"
    resume_from: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Any:
        """The knobs the environment sets, with the device's defaults and engines, and ``CHECKPOINT`` resolved."""
        env = dict(env)
        device = env.get("DEVICE") or "cuda"
        if device not in ENGINES:
            raise EvalRunError(f"DEVICE={device}: choose cuda or cpu")
        engines = ENGINES[device]
        rollout = env.get("ROLLOUT") or engines[0]
        if rollout == "sglang" and device == "cpu":
            raise EvalRunError(
                "ROLLOUT=sglang: SGLang has no CPU build on the package index (README); choose vllm or hf_cpu"
            )
        if rollout not in engines:
            raise EvalRunError(
                f"ROLLOUT={rollout}: on {'a CPU' if device == 'cpu' else 'GPUs'} choose {' or '.join(engines)}"
            )
        env["ROLLOUT"] = rollout
        for name, default in DEVICE_DEFAULTS[device].items():
            env[name] = env.get(name) or default
        # the evaluation reads the test set unless told otherwise; verl's idle train loader reads the same file
        data_dir = env.get("DATA_DIR") or cls.model_fields["data_dir"].default
        env["VAL_DATA"] = env.get("VAL_DATA") or f"{data_dir}/test.parquet"
        env["TRAIN_DATA"] = env["VAL_DATA"]
        checkpoint = env.get("CHECKPOINT", "")
        # the default experiment is named after what is evaluated, as given
        what = Path(checkpoint or env.get("MODEL_PATH") or "model").name
        env["EXPERIMENT_NAME"] = env.get("EXPERIMENT_NAME") or f"eval-{what}-{env.get('AGENT') or 'tool_agent'}"
        for name in ("RESUME_MODE", "RESUME_FROM"):
            env.pop(name, None)
        if checkpoint:
            resumed, model = resolve_checkpoint(checkpoint)
            env["CHECKPOINT"] = resumed or model
            if resumed:
                env |= {"RESUME_MODE": "resume_path", "RESUME_FROM": resumed}
            else:
                env["MODEL_PATH"] = model
        return super().from_env(env)

    @model_validator(mode="after")
    def _output_dir(self) -> EvalRunKnobs:
        object.__setattr__(self, "output_dir", absolute(self.output_dir or f"{self.run_dir}/generations"))
        return self


def resolve_checkpoint(checkpoint: str) -> tuple[str, str]:
    """``(verl checkpoint to resume, "")`` or ``("", Hugging Face model folder)`` for ``CHECKPOINT``, absolute; the
    folder holding ``latest_checkpointed_iteration.txt`` means its latest step."""
    path = Path(checkpoint)
    if not path.exists():
        raise EvalRunError(f"CHECKPOINT={checkpoint}: no such folder")
    path = path.resolve()
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        path = path / f"global_step_{latest.read_text().strip()}"
    if (path / "actor").is_dir():
        return str(path), ""
    if (path / "config.json").is_file():
        return "", str(path)
    raise EvalRunError(
        f"CHECKPOINT={path}: neither a verl checkpoint (no actor/) nor a Hugging Face model (no config.json)"
    )


def validation_overrides(knobs: EvalRunKnobs) -> list[str]:
    """What makes a run an evaluation: validation only, before any training, greedy, one sample, every generation
    dumped to ``OUTPUT_DIR``, the checkpoint resumed."""
    k = knobs
    rollout = "actor_rollout_ref.rollout.val_kwargs"
    resume = [f"trainer.resume_mode={k.resume_mode}"]
    if k.resume_from:
        resume.append(f"trainer.resume_from_path={k.resume_from}")
    return [
        "trainer.val_only=True",
        "trainer.val_before_train=True",
        f"trainer.validation_data_dir={k.output_dir}",
        f"data.train_max_samples={k.train_batch_size}",
        f"{rollout}.do_sample=False",
        f"{rollout}.temperature=0",
        f"{rollout}.n=1",
        *resume,
    ]


def gpu_eval_overrides(knobs: EvalRunKnobs) -> list[str]:
    """The GPU evaluation's verl overrides (FSDP with offload, dynamic batches) and the evaluation's own; the engine,
    attention, search and trainer-mode parts are the script's shell functions'."""
    k = knobs
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        *data_overrides(k),
        f"actor_rollout_ref.model.path={k.model_path}",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"{actor}.ppo_mini_batch_size={k.train_batch_size}",
        f"{actor}.use_dynamic_bsz=True",
        f"{actor}.use_kl_loss=False",
        f"{actor}.fsdp_config.param_offload=True",
        f"{actor}.fsdp_config.optimizer_offload=True",
        f"{rollout}.tensor_model_parallel_size={k.rollout_tp}",
        f"{rollout}.gpu_memory_utilization={value(k.gpu_memory_utilization)}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=8",
        f"trainer.logger={k.logger}",
        f"trainer.project_name={k.project_name}",
        f"trainer.experiment_name={k.experiment_name}",
        f"trainer.n_gpus_per_node={k.n_gpus}",
        f"trainer.nnodes={k.nnodes}",
        f"trainer.default_local_dir={k.run_dir}/checkpoints",
        *validation_overrides(k),
    ]


def main(argv: list[str] | None = None) -> int:
    def compose(knobs: EvalRunKnobs, _: object) -> list[str]:
        return validation_overrides(knobs) if knobs.device == "cpu" else gpu_eval_overrides(knobs)

    prog, description = "python -m verl_search.launch.eval_run", __doc__.split("\n")[0]
    return knobs_main(prog, description, EvalRunKnobs, compose, argv)


if __name__ == "__main__":
    sys.exit(main())
