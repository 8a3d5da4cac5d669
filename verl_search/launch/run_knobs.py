"""The knobs every run script shares, the overrides they compose (data, search tool and loop, attention),
and the CLI each script evals (the knobs as shell variables, the overrides as one array, nothing exported).

Invariant: a knob's environment variable is its field name in capitals; unset or empty variables keep the default
(like ``${X:-default}``); a bad knob raises an error naming the variable before the script writes anything.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from verl_search.errors import KnobError
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.run_outputs import resolve_step
from verl_search.launch.trainer_mode import TrainerSettings, knob_message
from verl_search.resources import AGENT_LOOP_YAML, SEARCH_TOOL_YAML, shipped_file

#: a run's copy of the tool YAML, in its run folder (``common.sh``'s ``vs_prepare_run`` writes it)
RUN_TOOL_YAML = "search_tool_config.yaml"
#: verl's attention when ``override_config.attn_implementation`` is unset
VERL_DEFAULT_ATTENTION = "flash_attention_2"
ATTENTION_KEY = "+actor_rollout_ref.model.override_config.attn_implementation"
REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
#: implementations whose kernels take packed variable-length sequences (what use_remove_padding feeds them)
PACKING_KERNELS = ("flash_attention_2", "flash_attention_3")


class RunKnobs(BaseModel):
    """The knobs of a GRPO search run that both scripts have; subclasses redeclare a field to change its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: the default experiment name is ``<prefix>-<agent>``
    experiment_prefix: ClassVar[str] = "grpo-search"

    model_path: str = Field(description="a model folder or hub id")
    data_dir: str = Field(str(Path.home() / "data" / "searchR1_processed_direct"), description="preprocessed data")
    train_data: str = Field("", description="default: DATA_DIR/train.parquet")
    val_data: str = Field("", description="default: DATA_DIR/val_subset.parquet")
    tool_config: str = Field("", description="the tool YAML to copy with the URL (default: the shipped one)")
    retriever_url: str = Field(
        "http://127.0.0.1:8000/retrieve", description="one URL, or several separated by commas (the tool balances)"
    )
    max_turns: int = Field(4, ge=1, description="assistant turns per trajectory: 4 = up to 3 searches and an answer")
    agent: Literal["tool_agent", "search_r1_agent"] = Field(
        "tool_agent",
        description="tool_agent: verl's hermes <tool_call> loop; search_r1_agent: the native <search> loop",
    )
    project_name: str = "verl_search"
    experiment_name: str = Field("", description="default: <the script's prefix>-AGENT")
    run_dir: str = Field("", description="default: runs/EXPERIMENT_NAME (made absolute)")
    agent_loop_config: str = Field("", description="search_r1_agent's loop YAML (default: the shipped one)")
    reward_fn_path: str = Field(
        "pkg://verl_search.reward", description="verl imports pkg:// paths as modules; a file path also works"
    )
    train_batch_size: int = Field(4, ge=1)
    ppo_mini_batch_size: int = Field(4, ge=1)
    rollout_n: int = Field(2, ge=1)
    lr: float = Field(1e-4, gt=0)
    kl_coef: float = Field(0.001, ge=0)
    max_prompt_length: int = Field(1024, ge=1)
    max_response_length: int = Field(512, ge=1)
    max_tool_response_length: int = Field(
        6000,
        ge=1,
        description="verl cuts tool text at this many characters (its own default, 256, cuts the first passage); "
        "it matches the shipped tool YAML's max_result_chars, so verl never cuts mid-passage",
    )
    total_epochs: int = Field(1, ge=1)
    save_freq: int = -1
    test_freq: int = -1
    logger: str = '["console","file"]'
    resume_from: str = Field(
        "",
        description="a checkpoint to start from on purpose: a global_step_N folder, or a checkpoint folder (its "
        "latest step); empty: verl's resume_mode, whose auto resumes only this experiment's own checkpoints",
    )

    @field_validator("resume_from")
    @classmethod
    def _resume_step(cls, path: str) -> str:
        return str(resolve_step(path)) if path else path

    @model_validator(mode="after")
    def _derived_defaults(self) -> RunKnobs:
        """The defaults that depend on other knobs."""
        derived = {
            "train_data": self.train_data or f"{self.data_dir}/train.parquet",
            "val_data": self.val_data or f"{self.data_dir}/val_subset.parquet",
            "tool_config": self.tool_config or str(shipped_file(SEARCH_TOOL_YAML)),
            "agent_loop_config": self.agent_loop_config or str(shipped_file(AGENT_LOOP_YAML)),
            "experiment_name": self.experiment_name or f"{self.experiment_prefix}-{self.agent}",
        }
        derived["run_dir"] = absolute(self.run_dir or f"runs/{derived['experiment_name']}")
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, overrides: Sequence[str] = ()) -> Any:
        """The knobs the environment sets (unset or empty variables keep their defaults, like ``${X:-default}``).

        ``overrides``: the hydra overrides the user appends to the script; a ``trainer.experiment_name=`` among them
        names the experiment (the last one wins, over ``EXPERIMENT_NAME``), so the run folder and its checkpoints
        follow the name verl logs under, as in plain verl.
        """
        raw = {name: env[name.upper()] for name in cls.model_fields if env.get(name.upper(), "") != ""}
        named = experiment_name_override(overrides)
        if named:
            raw["experiment_name"] = named
        if raw.get("total_steps") == "null":
            raw.pop("total_steps")
        try:
            return cls(**raw)
        except ValidationError as e:
            raise KnobError(knob_message(e, raw, cls)) from e


def experiment_name_override(overrides: Sequence[str]) -> str | None:
    """The value of the last ``trainer.experiment_name=`` override (``+``/``++`` prefixes and one pair of hydra
    quotes removed), or None."""
    name = None
    for override in overrides:
        key, sep, val = override.partition("=")
        if sep and key.lstrip("+") == "trainer.experiment_name":
            name = val[1:-1] if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"" else val
    return name or None


def absolute(path: str) -> str:
    """``path`` against the current folder, as the scripts' ``vs_abs`` does (no normalisation)."""
    return path if path.startswith("/") else f"{os.getcwd()}/{path}"


def value(v: object) -> str:
    """A knob's value as the shell and hydra read it (None is ``null``; ``1e-06`` is written ``1e-6``)."""
    if v is None:
        return "null"
    if isinstance(v, float):
        return re.sub(r"e([+-])0+(\d)", r"e\1\2", repr(v))
    return str(v)


def shell_assignments(knobs: RunKnobs, overrides: Sequence[str]) -> str:
    """``NAME=value`` lines (shell-quoted) for every knob, and ``VS_OVERRIDES``: the run's verl overrides, an array."""
    lines = [f"{name.upper()}={shlex.quote(value(v))}" for name, v in knobs.model_dump().items()]
    lines.append("VS_OVERRIDES=(" + " ".join(map(shlex.quote, overrides)) + ")")
    return "\n".join(lines) + "\n"


def data_overrides(knobs: RunKnobs) -> list[str]:
    """The overrides both scripts start with: GRPO without a KL term in the reward, and the data (the chat kept raw
    for the agent loops, overlong prompts filtered, nothing truncated silently)."""
    k = knobs
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={k.train_data}",
        f"data.val_files={k.val_data}",
        f"data.train_batch_size={k.train_batch_size}",
        f"data.max_prompt_length={k.max_prompt_length}",
        f"data.max_response_length={k.max_response_length}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.return_raw_chat=True",
    ]


def resume_overrides(resume_from: str) -> list[str]:
    """``RESUME_FROM`` as verl overrides (resume from that step; nothing when it is empty)."""
    if not resume_from:
        return []
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}"]


def search_overrides(knobs: RunKnobs, tool_config: str | Path) -> list[str]:
    """Our tool (the YAML ``tool_config``), loop and reward in verl's hermes multi-turn rollout, ``AGENT`` as the
    default loop (with its loop YAML for ``search_r1_agent``)."""
    k = knobs
    overrides = [
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={k.max_turns}",
        f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={k.max_tool_response_length}",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=right",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={k.agent}",
        f"reward.custom_reward_function.path={k.reward_fn_path}",
        "reward.custom_reward_function.name=compute_score",
    ]
    if k.agent == "search_r1_agent":
        overrides.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={k.agent_loop_config}")
    return overrides


@dataclass(frozen=True)
class AttentionChoice:
    """What the actor (and reference) model load with."""

    implementation: str
    remove_padding: bool
    reason: str


def choose_attention(requested: str, fa2_problem: str | None) -> AttentionChoice:
    """``auto`` takes FlashAttention-2 when transformers finds it usable (``fa2_problem`` is None), else ``sdpa``;
    padding removal (sequences packed into one row) goes with FlashAttention kernels only, whose variable-length
    path keeps packed sequences apart."""
    if requested == "auto":
        if fa2_problem is None:
            return AttentionChoice(VERL_DEFAULT_ATTENTION, True, "transformers finds FlashAttention-2")
        return AttentionChoice("sdpa", False, f"no FlashAttention-2: {fa2_problem}")
    return AttentionChoice(requested, requested in PACKING_KERNELS, "set by ATTN_IMPLEMENTATION")


def attention_overrides(requested: str, rollout: str) -> tuple[list[str], str]:
    """The actor's attention and padding removal for ``ATTN_IMPLEMENTATION=requested`` (``auto`` probes the installed
    FlashAttention-2), and the note a script prints on its choice (with the rollout engine's name)."""
    fa2_problem = InstalledEnvironment().flash_attention_2() if requested == "auto" else None
    choice = choose_attention(requested, fa2_problem)
    padding = "with padding removal" if choice.remove_padding else "without padding removal"
    note = f"rollout engine: {rollout}; actor attention: {choice.implementation}, {padding} ({choice.reason})"
    return [f"{ATTENTION_KEY}={choice.implementation}", f"{REMOVE_PADDING_KEY}={choice.remove_padding}"], note


def trainer_note(settings: TrainerSettings) -> str:
    """The trainer mode a run uses, as the scripts print it."""
    chosen = os.environ.get("TRAINER")
    return f"trainer: {settings.trainer_mode}" + (f" (TRAINER={chosen})" if chosen else "")


def knobs_main(
    prog: str,
    description: str,
    knobs_cls: type[RunKnobs],
    compose: Callable[[Any], tuple[list[str], list[str]]],
    argv: list[str] | None = None,
) -> int:
    """The CLI a run script evals: the knobs resolved from the environment and every override ``compose(knobs)`` makes
    of them, as :func:`shell_assignments`, with its notes on what it chose on stderr. A bad knob or trainer setting is
    one ``error:`` line and exit 1, before the script writes anything."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("overrides", nargs="*", help="the hydra overrides given to the script (after --)")
    args = p.parse_args(argv)
    try:
        knobs = knobs_cls.from_env(overrides=args.overrides)
        overrides, notes = compose(knobs)
    except KnobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(note, file=sys.stderr)
    sys.stdout.write(shell_assignments(knobs, overrides))
    return 0
