"""The training stages of ``make train``, each a verl command run in its own process group: SFT with verl's SFT
trainer on the CPU backend (then its HF checkpoint exported as a model folder), and GRPO or evaluation-only runs of
``python -m verl.trainer.main_ppo`` launched through ``run_scripts/run_tiny_search_cpu.sh``: the stage sets the script's
knobs and appends its own overrides, so the CPU recipe is written in one place.

Invariant: each is a :class:`~cpu_bench.train.stage.Stage`: a finished stage is reused by the next run with the same
inputs, an interrupted one is redone; a stage's overrides come from the settings models, never from the environment.
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpu_bench.train.config import TrainConfig
from cpu_bench.train.live_metrics import MetricsTail
from cpu_bench.train.processes import CHECKOUT, StageError, run_stage
from cpu_bench.train.stage import Stage, legacy_seconds
from verl_search.atomic import atomic_path
from verl_search.launch.cpu_recipe import CpuKnobs
from verl_search.launch.tool_yaml import URL_KEY
from verl_search.launch.trainer_mode import TrainerSettings

logger = logging.getLogger(__name__)

HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: the script every GRPO stage runs: the CPU recipe, its knobs checked and its preflight run before verl starts
CPU_SCRIPT = CHECKOUT / "run_scripts" / "run_tiny_search_cpu.sh"
#: the launch flags common.sh reads
LAUNCH_FLAGS = ("dry_run", "skip_preflight", "probe_timeout")
#: a model turn of the protocol is ~20-40 tokens; cap rambling ones
MAX_TURN_TOKENS = 96


def sft_command(config: TrainConfig, data: Path, model: Path, ckpt_dir: Path, epochs: int) -> list[str]:
    """``python -m cpu_bench.train.sft_cpu`` with the overrides verl's SFT trainer needs on a CPU."""
    s = config.sft
    return [
        sys.executable,
        "-m",
        "cpu_bench.train.sft_cpu",
        f"data.train_files={data}",
        "data.val_files=null",
        f"data.train_batch_size={s.batch_size}",
        f"data.micro_batch_size_per_gpu={s.batch_size}",
        "data.use_dynamic_bsz=True",
        f"data.max_token_len_per_gpu={s.batch_size * s.max_length}",
        f"data.max_length={s.max_length}",
        "data.truncation=error",
        "data.num_workers=0",
        "data.pad_mode=no_padding",
        "data.custom_cls.path=pkg://cpu_bench.train.sft_dataset",
        "data.custom_cls.name=SearchSFTDataset",
        f"model.path={model}",
        "model.use_remove_padding=False",
        "model.enable_gradient_checkpointing=False",
        "+model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2",
        "engine.model_dtype=fp32",
        # verl's FSDP engine otherwise computes in bf16, which a CPU without avx512_bf16 or AMX emulates, far slower
        "+engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "engine.use_torch_compile=False",
        f"optim.lr={s.lr}",
        f"optim.lr_warmup_steps={s.warmup_steps}",
        "optim.weight_decay=0.0",
        "trainer.device=cpu",
        f"trainer.total_epochs={epochs}",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={ckpt_dir}",
        "trainer.project_name=verl_search_train",
        f"trainer.experiment_name={ckpt_dir.parent.name}",
        f"trainer.seed={config.model.seed}",
        "trainer.resume_mode=disable",
        "checkpoint.save_contents=[model,extra,hf_model]",
    ]


def export_hf(ckpt_dir: Path, out: Path) -> Path:
    """Copy the latest ``global_step_N/huggingface`` folder of an SFT run to ``out`` (a model folder verl loads)."""
    steps = sorted(ckpt_dir.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if not steps:
        raise StageError(f"no checkpoint under {ckpt_dir}")
    source = steps[-1] / "huggingface"
    missing = [name for name in HF_FILES if not (source / name).is_file()]
    if missing:
        raise StageError(f"{source} lacks {missing}: was checkpoint.save_contents given hf_model?")
    with atomic_path(out) as tmp:
        shutil.copytree(source, tmp)
    return out


def sft_stage(config: TrainConfig, data: Path, model: Path, stage_dir: Path, epochs: int, key: dict) -> Stage:
    """SFT of ``model`` on ``data`` into ``stage_dir/model``; ``key`` names the stages it builds on."""

    def build(folder: Path) -> None:
        env = {"VERL_FILE_LOGGER_PATH": str(folder / "metrics.jsonl")}
        command = sft_command(config, data, model, folder / "checkpoints", epochs)
        run_stage(f"SFT {folder.name}", command, folder / "sft.log", env)
        export_hf(folder / "checkpoints", folder / "model")
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)  # optimizer state: not needed any more

    key = {**key, "sft": config.sft.model_dump(mode="json"), "epochs": epochs, "seed": config.model.seed}
    return Stage(f"SFT {stage_dir.name}", stage_dir, key, build, legacy_seconds("model/config.json", "done.json"))


def run_sft(
    config: TrainConfig, data: Path, model: Path, stage_dir: Path, epochs: int, key: dict | None = None
) -> tuple[Path, float]:
    """SFT ``model`` on ``data``; returns the exported model folder and the seconds it took (when it was built)."""
    record = sft_stage(config, data, model, stage_dir, epochs, key or {}).ensure()
    return stage_dir / "model", record.seconds


@dataclass(frozen=True)
class GRPORun:
    """A finished main_ppo run: its folder, metrics file, validation dumps and wall time."""

    run_dir: Path
    metrics: Path
    val_dir: Path
    seconds: float
    reused: bool = False  # finished by an earlier run: ``seconds`` is that run's


def grpo_knobs(
    config: TrainConfig, model: Path, train: Path, val: Path, tool_yaml: Path, run_dir: Path
) -> dict[str, str]:
    """The CPU script's knobs for this run, as the environment variables it reads."""
    g, s = config.grpo, config.search
    return {
        "MODEL_PATH": str(model),
        "TRAIN_DATA": str(train),
        "VAL_DATA": str(val),
        "TOOL_CONFIG": str(tool_yaml),
        "AGENT": g.agent,
        "ROLLOUT": g.rollout,
        "MAX_TURNS": str(config.search.max_turns),
        "RUN_DIR": str(run_dir),
        "EXPERIMENT_NAME": run_dir.name,
        "TRAIN_BATCH_SIZE": str(g.batch_size),
        "PPO_MINI_BATCH_SIZE": str(g.batch_size),
        "ROLLOUT_N": str(g.rollout_n),
        "LR": repr(g.lr),
        "KL_COEF": repr(g.kl_coef),
        "MAX_PROMPT_LENGTH": str(g.max_prompt_length),
        "MAX_RESPONSE_LENGTH": str(g.max_response_length),
        # >= the tool's own cap, so verl never cuts a result (the preflight also wants room for topk whole passages)
        "MAX_TOOL_RESPONSE_LENGTH": str(max(s.max_result_chars, s.topk * 800, _page_chars(config))),
        "MICRO_BATCH": str(g.batch_size * g.rollout_n),
        "TOTAL_STEPS": str(g.steps),
        "TEST_FREQ": str(g.test_freq),
        "SAVE_FREQ": str(g.steps),
        "RESUME_MODE": "disable",
        "LOGGER": '["console","file"]',
    }


def _page_chars(config: TrainConfig) -> int:
    """The access tool's window in the pages world (0 elsewhere): verl must not cut a page either."""
    from cpu_bench.train.pages_data import PAGE_WINDOW_CHARS

    return PAGE_WINDOW_CHARS if config.world.kind == "pages" else 0


def grpo_overrides(config: TrainConfig, val_only: bool) -> list[str]:
    """What a GRPO (or evaluation-only) run of ``make train`` adds after the CPU script's recipe: validate first,
    the sampling temperature, the turn cap, the data order's seed and the reward's options."""
    return [
        "trainer.val_before_train=True",
        f"trainer.val_only={val_only}",
        f"actor_rollout_ref.rollout.temperature={config.grpo.temperature}",
        f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{max_tokens_per_turn:{MAX_TURN_TOKENS}}}",
        f"data.seed={config.world.split_seed}",
        *(f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in sorted(config.grpo.reward.items())),
    ]


def script_env(knobs: dict[str, str], run_dir: Path) -> dict[str, str]:
    """The CPU script's environment for a stage: ``knobs``, this Python, the metrics where the stage watches them, and
    every other knob the script or its trainer mode reads left empty (its default), so the user's shell never
    changes a stage."""
    names = [*CpuKnobs.model_fields, *TrainerSettings.model_fields, "trainer_mode", *LAUNCH_FLAGS]
    return {
        **dict.fromkeys((name.upper() for name in names), ""),
        **knobs,
        "PYTHON": sys.executable,
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run_dir / "tensorboard"),
    }


def tool_url(tool_yaml: Path) -> str:
    """The retriever URL the data stage wrote into ``tool_yaml`` (the script writes it into the run's copy again)."""
    url = yaml.safe_load(tool_yaml.read_text(encoding="utf-8"))["tools"][0]["config"][URL_KEY]
    return ",".join(url) if isinstance(url, list) else str(url)


def grpo_env(
    config: TrainConfig, model: Path, train: Path, val: Path, tool_yaml: Path, run_dir: Path
) -> dict[str, str]:
    """The CPU script's environment for a GRPO stage: its knobs, with the retriever the data stage's tool YAML names."""
    knobs = grpo_knobs(config, model, train, val, tool_yaml, run_dir) | {"RETRIEVER_URL": tool_url(tool_yaml)}
    return script_env(knobs, run_dir)


def grpo_stage(
    config: TrainConfig,
    model: Path,
    train: Path,
    val: Path,
    tool_yaml: Path,
    run_dir: Path,
    *,
    val_only: bool = False,
    key: dict | None = None,
) -> Stage:
    """GRPO from ``model`` (validating before training and every ``test_freq`` steps), or only the validation, as
    a stage; ``key`` names the stages it builds on."""
    name = "evaluation" if val_only else "GRPO"

    def build(folder: Path) -> None:
        env = grpo_env(config, model, train, val, tool_yaml, folder)
        command = ["bash", str(CPU_SCRIPT), *grpo_overrides(config, val_only)]
        log = folder.parent / f"{folder.name}.log"
        live = MetricsTail(folder / "metrics.jsonl", f"{name} {folder.name}", None if val_only else config.grpo.steps)
        run_stage(f"{name} {folder.name}", command, log, env, watch=live.poll)

    stage_key: dict[str, Any] = {**(key or {}), "val_only": val_only, "split_seed": config.world.split_seed}
    stage_key |= {"grpo": config.grpo.model_dump(mode="json"), "search": config.search.model_dump(mode="json")}
    return Stage(f"{name} {run_dir.name}", run_dir, stage_key, build, legacy_seconds("done.json", "done.json"))


def run_grpo(
    config: TrainConfig,
    model: Path,
    train: Path,
    val: Path,
    tool_yaml: Path,
    run_dir: Path,
    *,
    val_only: bool = False,
    key: dict | None = None,
) -> GRPORun:
    """Run (or reuse) :func:`grpo_stage`; returns the run's paths and the seconds it took (when it was built)."""
    stage = grpo_stage(config, model, train, val, tool_yaml, run_dir, val_only=val_only, key=key)
    record = stage.ensure()
    return GRPORun(run_dir, run_dir / "metrics.jsonl", run_dir / "val_generations", record.seconds, record.reused)
