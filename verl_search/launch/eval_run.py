"""The knobs of an evaluation with search (``run_scripts/eval_search.sh``: verl's validation-only mode, greedy, every
generation dumped) and the verl overrides they mean; the script evals ``python -m verl_search.launch.eval_run``.

Invariant: what to evaluate is decided once, by :func:`resolve_checkpoint` (a verl checkpoint resumes the actor on top
of ``MODEL_PATH``; a Hugging Face model folder is the model). ``DEVICE=cpu`` hands the run to
``run_tiny_search_cpu.sh`` and appends only :func:`validation_overrides`, which win because they come later.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from verl_search.data.pipeline import VAL_SUBSET_NAME
from verl_search.errors import KnobError
from verl_search.launch.checks import PreflightError, preprocess_command, read_data_file
from verl_search.launch.run_knobs import RunKnobs, absolute, data_overrides, gpu_parts, knobs_main, value
from verl_search.launch.run_outputs import LATEST_FILE, STEP_PREFIX, latest_step
from verl_search.resources import checkout_root

#: per device: the engines that run there, the first is the default
ENGINES = {"cuda": ("sglang", "vllm"), "cpu": ("vllm", "hf_cpu")}
#: per device: the defaults that differ (the GPU recipe's model; a CPU needs a model the user names)
DEVICE_DEFAULTS = {
    "cuda": {"MODEL_PATH": "Qwen/Qwen2.5-3B-Instruct", "TRAIN_BATCH_SIZE": "64"},
    "cpu": {"TRAIN_BATCH_SIZE": "4"},
}
#: the published recipe's full test set and the time one validation pass over it took there (8xH20)
FULL_TEST_NAME = "test.parquet"
FULL_TEST_ROWS = 51_713
RECIPE_PASS_SECONDS = 6_000


class EvalRunKnobs(RunKnobs):
    """Every knob of ``eval_search.sh``; the environment variable is the field name in capitals. ``RESUME_MODE`` and
    ``RESUME_FROM`` are derived from ``CHECKPOINT``, never set by hand."""

    experiment_prefix: ClassVar[str] = "eval"

    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="cuda, or cpu (verl's CPU trainer, run_tiny_search_cpu.sh)"
    )
    model_path: str = Field(
        description="a model folder, e.g. the one the checkpoint was trained from (runs/train/sft/model)"
    )
    checkpoint: str = Field("", description="a verl checkpoint folder or a Hugging Face model folder")
    val_data: str = Field(
        "",
        description="default: DATA_DIR/val_subset.parquet (at most 500 test rows per source, which the preprocessing "
        "writes by default); FULL_TEST=1: DATA_DIR/test.parquet",
    )
    full_test: bool = Field(
        False,
        description="1: evaluate the full test set, DATA_DIR/test.parquet (51,713 rows: the published recipe took "
        "about 6,000 s per pass on 8xH20); an explicit VAL_DATA still wins",
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
        "auto", description="the actor's attention: auto (flash_attention_2 when transformers finds it, else sdpa)"
    )
    rollout_tp: int = Field(1, ge=1, description="the engine's tensor parallelism")
    gpu_memory_utilization: float = Field(0.7, gt=0, le=1)
    resume_mode: Literal["disable", "resume_path"] = "disable"
    resume_from: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, overrides: Sequence[str] = ()) -> Any:
        """The knobs the environment sets, with the device's defaults and engines, and ``CHECKPOINT`` resolved."""
        env = dict(env)
        device = env.get("DEVICE") or "cuda"
        if device not in ENGINES:
            raise KnobError(f"DEVICE={device}: choose cuda or cpu")
        engines = ENGINES[device]
        rollout = env.get("ROLLOUT") or engines[0]
        if rollout == "sglang" and device == "cpu":
            raise KnobError(
                "ROLLOUT=sglang: SGLang has no CPU build on the package index (README); choose vllm or hf_cpu"
            )
        if rollout not in engines:
            raise KnobError(
                f"ROLLOUT={rollout}: on {'a CPU' if device == 'cpu' else 'GPUs'} choose {' or '.join(engines)}"
            )
        env["ROLLOUT"] = rollout
        for name, default in DEVICE_DEFAULTS[device].items():
            env[name] = env.get(name) or default
        # the evaluation reads the validation subset unless told otherwise (FULL_TEST=1: the whole test split, hours
        # on 8 GPUs); verl's idle train loader reads the same file
        try:  # read as the field reads it (1/0, true/false, and the True the shell assignments hand back)
            full_test = TypeAdapter(bool).validate_python(env.get("FULL_TEST") or False)
        except ValidationError as e:
            raise KnobError(f"FULL_TEST={env['FULL_TEST']}: choose 1 (the full test set) or 0 (the subset)") from e
        data_dir = env.get("DATA_DIR") or cls.model_fields["data_dir"].default
        default_name = FULL_TEST_NAME if full_test else VAL_SUBSET_NAME
        env["VAL_DATA"] = env.get("VAL_DATA") or f"{data_dir}/{default_name}"
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
        return super().from_env(env, overrides)

    @model_validator(mode="after")
    def _output_dir(self) -> EvalRunKnobs:
        object.__setattr__(self, "output_dir", absolute(self.output_dir or f"{self.run_dir}/generations"))
        return self


def resolve_checkpoint(checkpoint: str) -> tuple[str, str]:
    """``(verl checkpoint to resume, "")`` or ``("", Hugging Face model folder)`` for ``CHECKPOINT``, absolute; the
    folder holding ``latest_checkpointed_iteration.txt`` means its latest step."""
    path = Path(checkpoint)
    if not path.exists():
        raise KnobError(f"CHECKPOINT={checkpoint}: no such folder")
    path = path.resolve()
    if (path / LATEST_FILE).is_file():
        path = path / f"{STEP_PREFIX}{latest_step(path)}"
    if (path / "actor").is_dir():
        return str(path), ""
    if (path / "config.json").is_file():
        return "", str(path)
    raise KnobError(
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
    """The GPU evaluation's verl overrides (FSDP with offload, dynamic batches) and the evaluation's own."""
    k = knobs
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        *data_overrides(k),
        f"actor_rollout_ref.model.path={k.model_path}",
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


def data_notes(knobs: EvalRunKnobs) -> list[str]:
    """What to expect of the evaluated data: that an explicit VAL_DATA wins over FULL_TEST=1, and for the full test set
    (a test.parquet, or a file of its 51,713 rows) its rows and the time per validation pass, the published recipe's
    figure scaled by rows."""
    notes = []
    path = Path(knobs.val_data)
    if knobs.full_test and path != Path(knobs.data_dir) / FULL_TEST_NAME:
        notes.append(f"eval: FULL_TEST=1, but VAL_DATA={knobs.val_data} is set and is what gets evaluated")
    try:
        rows = read_data_file(str(path)).rows
    except PreflightError:
        return notes  # the preflight says why
    if not (path.name == FULL_TEST_NAME or rows == FULL_TEST_ROWS):
        return notes
    recipe = f"the published recipe's ~{RECIPE_PASS_SECONDS:,} s per {FULL_TEST_ROWS:,}-row pass on 8xH20"
    seconds = RECIPE_PASS_SECONDS * rows / FULL_TEST_ROWS
    hours = f" ({seconds / 3600:.1f} h)" if seconds >= 3600 else ""
    expect = f"about {seconds:,.0f} s{hours} per validation pass"
    where = f"({recipe})" if rows == FULL_TEST_ROWS else f"({recipe}, scaled by rows)"
    notes.append(
        f"eval: evaluating the full test set {path}: {rows:,} rows, {expect} {where}; "
        f"DATA_DIR/{VAL_SUBSET_NAME} (the default VAL_DATA, at most 500 rows per source) is the quick check"
    )
    return notes


def missing_data_hint(knobs: EvalRunKnobs) -> str | None:
    """How to make VAL_DATA when it is a missing file the preprocessing writes (val_subset.parquet or test.parquet),
    and for the subset, the full test set as the other choice; None otherwise."""
    path = Path(knobs.val_data)
    if path.exists() or path.name not in (VAL_SUBSET_NAME, FULL_TEST_NAME):
        return None
    template = " --template search_r1" if knobs.agent == "search_r1_agent" else ""
    root = checkout_root()
    make = f"{f'cd {root} && ' if root else ''}{preprocess_command()} --local_dir {path.absolute().parent}{template}"
    hint = f"eval: VAL_DATA={path} does not exist; make it with `{make}` (train, test and {VAL_SUBSET_NAME})"
    if path.name == VAL_SUBSET_NAME:
        hint += f", or evaluate the full test set with FULL_TEST=1 (DATA_DIR/{FULL_TEST_NAME})"
    return hint


def main(argv: list[str] | None = None) -> int:
    def compose(knobs: EvalRunKnobs) -> tuple[list[str], list[str]]:
        notes = [*data_notes(knobs), *filter(None, [missing_data_hint(knobs)])]
        if knobs.device == "cpu":  # run_tiny_search_cpu.sh composes the rest
            return validation_overrides(knobs), notes
        parts, gpu_notes = gpu_parts(
            knobs,
            rollout=knobs.rollout,
            attention=knobs.attn_implementation,
            devices=knobs.n_gpus,
            mini_batch_size=knobs.train_batch_size,
        )
        return [*gpu_eval_overrides(knobs), *parts], [*gpu_notes, *notes]

    prog, description = "python -m verl_search.launch.eval_run", __doc__.split("\n")[0]
    return knobs_main(prog, description, EvalRunKnobs, compose, argv)


if __name__ == "__main__":
    sys.exit(main())
