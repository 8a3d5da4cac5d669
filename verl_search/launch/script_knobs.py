"""What every run script's knobs have in common as Python checks them: read from the environment the script exported,
typed and bounded by a pydantic model whose field names are the knobs in lower case, a bad value one
:class:`~verl_search.errors.KnobError` naming it.

Invariant: a knob's default and meaning are declared once, in its script (``${VAR:-default}`` and its comment); these
models hold only types and bounds, never a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from verl_search.errors import KnobError
from verl_search.launch.run_outputs import resolve_step


class ScriptKnobs(BaseModel):
    """The knobs of one run script; the environment variable is the field name in capitals. Every script has the data,
    the tool config it copies and the retriever URL it writes into that copy, the agent loop, the training batch (an
    evaluation's idle train loader reads it too) and the run's names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: str
    train_data: str = Field(min_length=1)
    val_data: str = Field(min_length=1)
    tool_config: str = Field(min_length=1)
    retriever_url: str = Field(min_length=1)
    agent: Literal["tool_agent", "search_r1_agent"]
    agent_loop_config: str
    max_turns: int = Field(ge=1)
    max_tool_response_length: int = Field(ge=1)
    reward_fn_path: str = Field(min_length=1)
    train_batch_size: int = Field(ge=1)
    project_name: str = Field(min_length=1)
    experiment_name: str = Field(min_length=1)
    run_dir: str = Field(min_length=1)

    @property
    def expected_agent(self) -> str | None:
        """The agent loop the preflight requires every data row to ask for (None: no such check)."""
        return self.agent

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """The knobs as the script exported them (it sets every one, its default where the user set none)."""
        missing = [name.upper() for name in cls.model_fields if name.upper() not in env]
        if missing:
            raise KnobError(f"{', '.join(missing)} not set: run the script, which sets every knob")
        raw = {name: env[name.upper()] for name in cls.model_fields}
        try:
            return cls(**raw)
        except ValidationError as e:
            raise KnobError(knob_message(e, raw, cls)) from e


class ResumableKnobs(ScriptKnobs):
    """A script with ``RESUME_FROM``: a ``global_step_N`` folder, or a checkpoint folder meaning its latest step."""

    resume_from: str

    @field_validator("resume_from")
    @classmethod
    def _resume_step(cls, path: str) -> str:
        return str(resolve_step(path)) if path else path


class TrainingKnobs(ResumableKnobs):
    """What both training scripts (GPU and CPU) add to every script's knobs: the model, GRPO's sizes and rates, the
    schedule, the logger and a resume."""

    model_path: str = Field(min_length=1)
    ppo_mini_batch_size: int = Field(ge=1)
    rollout_n: int = Field(ge=1)
    lr: float = Field(gt=0)
    kl_coef: float = Field(ge=0)
    max_prompt_length: int = Field(ge=1)
    max_response_length: int = Field(ge=1)
    total_epochs: int = Field(ge=1)
    save_freq: int
    test_freq: int
    logger: str = Field(min_length=1)


def knob_message(error: ValidationError, raw: Mapping[str, object], model: type[BaseModel]) -> str:
    """The first problem of ``error`` in one line naming the knob, as the scripts say it: ``NAME=value: why``, ``choose
    a or b`` for a value outside a list, ``set NAME to <what it is>`` for a missing one."""
    first = error.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    if first["type"] == "missing":
        return f"set {name.upper()} to {model.model_fields[name].description}"
    where = f"{name.upper()}={raw.get(name, '')}: " if name else ""
    if first["type"] == "literal_error":
        return f"{where}choose {first['ctx']['expected'].replace(chr(39), '')}"
    return where + str(first["msg"]).removeprefix("Value error, ")
