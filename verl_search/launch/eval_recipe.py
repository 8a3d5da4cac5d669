"""The evaluation's knobs as Python checks them, the overrides ``eval_search.sh`` cannot write literally (the actor's
attention, from a probe of the installed FlashAttention-2, and the trainer mode's), and its notes on the evaluated
data (the full test set's rows and time per pass, how to make a missing validation file).

Invariant: each knob's default and meaning are declared once, in the script (``${VAR:-default}`` and its comment);
this model holds only types and bounds. ``DEVICE=cpu`` adds no override here: ``run_tiny_search_cpu.sh`` composes
the CPU run's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from verl_search.data.pipeline import VAL_SUBSET_NAME
from verl_search.launch.attention import attention_overrides
from verl_search.launch.checks import PreflightError, preprocess_command, read_data_file
from verl_search.launch.script_knobs import ScriptKnobs
from verl_search.launch.trainer_mode import settings_from_env, trainer_note, trainer_overrides
from verl_search.resources import checkout_root

#: per device: the engines that run there
ENGINES = {"cuda": ("sglang", "vllm"), "cpu": ("vllm", "hf_cpu")}
#: the published recipe's full test set and the time one validation pass over it took there (8xH20)
FULL_TEST_NAME = "test.parquet"
FULL_TEST_ROWS = 51_713
RECIPE_PASS_SECONDS = 6_000


class EvalKnobs(ScriptKnobs):
    """Every knob of ``eval_search.sh``; the environment variable is the field name in capitals. On a CPU the knobs
    run_tiny_search_cpu.sh defaults itself (MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH, LOGGER) may be empty."""

    device: Literal["cuda", "cpu"]
    model_path: str
    checkpoint: str
    full_test: str
    output_dir: str = Field(min_length=1)
    rollout: str
    attn_implementation: str = Field(min_length=1)
    n_gpus: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    max_prompt_length: int | None = Field(ge=1)
    max_response_length: int | None = Field(ge=1)
    rollout_tp: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    logger: str

    @field_validator("full_test")
    @classmethod
    def _full_test(cls, value: str) -> str:
        if value not in ("0", "1"):
            raise ValueError("choose 1 (the full test set) or 0 (the subset)")
        return value

    @field_validator("rollout")
    @classmethod
    def _engine_of_the_device(cls, rollout: str, info: ValidationInfo) -> str:
        device = info.data.get("device")
        if device is None:  # DEVICE itself is named
            return rollout
        if rollout == "sglang" and device == "cpu":
            raise ValueError("SGLang has no CPU build on the package index (README); choose vllm or hf_cpu")
        if rollout not in ENGINES[device]:
            raise ValueError(f"on {'a CPU' if device == 'cpu' else 'GPUs'} choose {' or '.join(ENGINES[device])}")
        return rollout

    @field_validator("max_prompt_length", "max_response_length", mode="before")
    @classmethod
    def _cpu_scripts_default(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _a_model(self) -> EvalKnobs:
        """A CPU has no default model (checked last, as pydantic reports a missing field)."""
        if not self.model_path:
            raise ValueError(
                "set MODEL_PATH to a model folder, e.g. the one the checkpoint was trained from (runs/train/sft/model)"
            )
        return self


def derived_overrides(knobs: EvalKnobs, env: Mapping[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """The overrides Python adds to the script's literal ones on GPUs (attention, trainer mode), and the notes for the
    user: on each choice, and on the evaluated data."""
    notes = [*data_notes(knobs), *filter(None, [missing_data_hint(knobs)])]
    if knobs.device == "cpu":  # run_tiny_search_cpu.sh adds the CPU run's own
        return [], notes
    attention, attention_note = attention_overrides(knobs.attn_implementation, knobs.rollout)
    settings = settings_from_env(env)
    sizes = {"train_batch_size": knobs.train_batch_size, "mini_batch_size": knobs.train_batch_size}
    trainer = trainer_overrides(settings, devices=knobs.n_gpus, device="cuda", **sizes)
    return [*attention, *trainer], [attention_note, trainer_note(settings), *notes]


def data_notes(knobs: EvalKnobs) -> list[str]:
    """What to expect of the evaluated data: that an explicit VAL_DATA wins over FULL_TEST=1, and for the full test set
    (a test.parquet, or a file of its 51,713 rows) its rows and the time per validation pass, the published recipe's
    figure scaled by rows."""
    notes = []
    path = Path(knobs.val_data)
    if knobs.full_test == "1" and path != Path(knobs.data_dir) / FULL_TEST_NAME:
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


def missing_data_hint(knobs: EvalKnobs) -> str | None:
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
