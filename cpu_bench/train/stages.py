"""The training stages of ``make train``, each a verl command run in its own process group: SFT with verl's SFT
trainer on the CPU backend (then its HF checkpoint exported as a model folder), and GRPO or evaluation-only runs of
``python -m verl.trainer.main_ppo`` with the overrides :mod:`cpu_bench.cpu_run_knobs` composes (the mapping
``run_scripts/run_tiny_search_cpu.sh`` uses too).

Invariant: each is a :class:`~cpu_bench.train.stage.Stage`: a finished stage is reused by the next run with the same
inputs, an interrupted one is redone; a stage's overrides come from the settings models, never from the environment.
"""

from __future__ import annotations

import logging
import resource
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpu_bench.cpu_run_knobs import CpuRunKnobs, run_overrides
from cpu_bench.train.config import TrainConfig
from cpu_bench.train.live_metrics import MetricsTail
from cpu_bench.train.processes import StageError, run_stage
from cpu_bench.train.stage import Stage, legacy_seconds
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")
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


def grpo_knobs(config: TrainConfig, model: Path, train: Path, val: Path, run_dir: Path) -> CpuRunKnobs:
    """The CPU run's knobs for this run (the run script's environment variables, as typed settings)."""
    g = config.grpo
    return CpuRunKnobs(
        model_path=str(model),
        train_data=str(train),
        val_data=str(val),
        agent=g.agent,
        rollout=g.rollout,
        max_turns=config.search.max_turns,
        run_dir=str(run_dir),
        experiment_name=run_dir.name,
        train_batch_size=g.batch_size,
        ppo_mini_batch_size=g.batch_size,
        rollout_n=g.rollout_n,
        lr=g.lr,
        kl_coef=g.kl_coef,
        max_prompt_length=g.max_prompt_length,
        max_response_length=g.max_response_length,
        # >= the tool's own cap, so verl never cuts a result (the preflight also wants room for topk whole passages)
        max_tool_response_length=max(config.search.max_result_chars, config.search.topk * 800),
        micro_batch=g.batch_size * g.rollout_n,
        total_steps=g.steps,
        test_freq=g.test_freq,
        save_freq=g.steps,
        resume_mode="disable",
        logger='["console","file"]',
    )


def grpo_overrides(
    config: TrainConfig, model: Path, train: Path, val: Path, tool_yaml: Path, run_dir: Path, val_only: bool
) -> list[str]:
    """The overrides of a GRPO (or evaluation-only) run of ``make train``: the CPU search run's, then this
    pipeline's own (validate first, sampling temperature, the turn cap, the data order's seed)."""
    knobs = grpo_knobs(config, model, train, val, run_dir)
    return [
        *run_overrides(knobs, tool_yaml),
        "trainer.val_before_train=True",
        f"trainer.val_only={val_only}",
        f"actor_rollout_ref.rollout.temperature={config.grpo.temperature}",
        f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{max_tokens_per_turn:{MAX_TURN_TOKENS}}}",
        f"data.seed={config.world.split_seed}",
        *(f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in sorted(config.grpo.reward.items())),
    ]


def cpu_run_env(run_dir: Path) -> dict[str, str]:
    """The environment of a CPU run (the CPU platform, FSDP engines looked up under "cuda")."""
    return {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run_dir / "tensorboard"),
        # a one-machine Ray on 127.0.0.1, so the rollout servers listen on loopback (as run_tiny_search_cpu.sh)
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def raise_open_file_limit(wanted: int = 65535) -> None:
    """Raise this process's (and its children's) open-file limit towards ``wanted``, as the run scripts do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


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
        overrides = grpo_overrides(config, model, train, val, tool_yaml, folder, val_only)
        log = folder.parent / f"{folder.name}.log"
        agent = ["--agent", config.grpo.agent]
        preflight = [sys.executable, "-m", "verl_search.launch.preflight", *agent, "--", *overrides]
        preflight_log = folder.parent / f"{folder.name}.preflight.log"
        run_stage(f"{name} preflight {folder.name}", preflight, preflight_log, cpu_run_env(folder))
        raise_open_file_limit()
        command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
        live = MetricsTail(folder / "metrics.jsonl", f"{name} {folder.name}", None if val_only else config.grpo.steps)
        run_stage(f"{name} {folder.name}", command, log, cpu_run_env(folder), watch=live.poll)

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
