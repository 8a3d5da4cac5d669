"""The training stages of ``make train``, each a verl command run in its own process group: SFT with verl's SFT
trainer on the CPU backend (then its HF checkpoint exported as a model folder), and GRPO or evaluation-only runs
through ``run_scripts/run_tiny_search_cpu.sh`` (``python -m verl.trainer.main_ppo``).

Invariant: a stage's output folder is complete or absent (exports are atomic), so a finished stage is reused by the
next run with the same settings and an interrupted one is redone.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.train.config import TrainConfig
from verl_search.train.processes import REPO, StageError, run_stage

logger = logging.getLogger(__name__)

CPU_SCRIPT = REPO / "run_scripts" / "run_tiny_search_cpu.sh"
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def sft_command(config: TrainConfig, data: Path, model: Path, ckpt_dir: Path, epochs: int) -> list[str]:
    """``python -m verl_search.train.sft_cpu`` with the overrides verl's SFT trainer needs on a CPU."""
    s = config.sft
    return [
        sys.executable,
        "-m",
        "verl_search.train.sft_cpu",
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
        "data.custom_cls.path=pkg://verl_search.train.sft_dataset",
        "data.custom_cls.name=SearchSFTDataset",
        f"model.path={model}",
        "model.use_remove_padding=False",
        "model.enable_gradient_checkpointing=False",
        "+model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2",
        "engine.model_dtype=fp32",
        # verl's FSDP engine otherwise computes in bf16, which a CPU without avx512_bf16/AMX emulates (~10x slower)
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


def run_sft(config: TrainConfig, data: Path, model: Path, stage_dir: Path, epochs: int) -> tuple[Path, float]:
    """SFT ``model`` on ``data``; returns the exported model folder and the seconds taken (0 when reused)."""
    out, done = stage_dir / "model", stage_dir / "done.json"
    if (out / "config.json").is_file():
        logger.info("reusing %s", out)
        return out, json.loads(done.read_text())["seconds"] if done.is_file() else 0.0
    shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
    env = {"VERL_FILE_LOGGER_PATH": str(stage_dir / "metrics.jsonl")}
    command = sft_command(config, data, model, stage_dir / "checkpoints", epochs)
    seconds = run_stage(f"SFT {stage_dir.name}", command, stage_dir / "sft.log", env)
    export_hf(stage_dir / "checkpoints", out)
    shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)  # optimizer state: not needed any more
    with atomic_path(done) as tmp:
        tmp.write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
    return out, seconds


@dataclass(frozen=True)
class GRPORun:
    """A finished main_ppo run: its folder, metrics file, validation dumps and wall time."""

    run_dir: Path
    metrics: Path
    val_dir: Path
    seconds: float


def grpo_env(config: TrainConfig, model: Path, train: Path, val: Path, tool_yaml: Path, url: str, run_dir: Path):
    """The run script's knobs for this run (every one is an environment variable of run_tiny_search_cpu.sh)."""
    g = config.grpo
    return {
        "PYTHON": sys.executable,
        "MODEL_PATH": str(model),
        "TRAIN_DATA": str(train),
        "VAL_DATA": str(val),
        "TOOL_CONFIG": str(tool_yaml),
        "RETRIEVER_URL": url,
        "AGENT": g.agent,
        "MAX_TURNS": str(config.search.max_turns),
        "RUN_DIR": str(run_dir),
        "EXPERIMENT_NAME": run_dir.name,
        "TRAIN_BATCH_SIZE": str(g.batch_size),
        "PPO_MINI_BATCH_SIZE": str(g.batch_size),
        "ROLLOUT_N": str(g.rollout_n),
        "LR": str(g.lr),
        "KL_COEF": str(g.kl_coef),
        "MAX_PROMPT_LENGTH": str(g.max_prompt_length),
        "MAX_RESPONSE_LENGTH": str(g.max_response_length),
        # >= the tool's own cap, so verl never cuts a result (the preflight also wants room for topk whole passages)
        "MAX_TOOL_RESPONSE_LENGTH": str(max(config.search.max_result_chars, config.search.topk * 800)),
        "MICRO_BATCH": str(g.batch_size * g.rollout_n),
        "TOTAL_STEPS": str(g.steps),
        "TEST_FREQ": str(g.test_freq),
        "SAVE_FREQ": str(g.steps),
        "RESUME_MODE": "disable",
        "LOGGER": '["console","file"]',
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
    }


def run_grpo(
    config: TrainConfig,
    model: Path,
    train: Path,
    val: Path,
    tool_yaml: Path,
    url: str,
    run_dir: Path,
    *,
    val_only: bool = False,
) -> GRPORun:
    """GRPO from ``model`` (validating before training and every ``test_freq`` steps), or only the validation."""
    done = run_dir / "done.json"
    if done.is_file():
        logger.info("reusing %s", run_dir)
        seconds = json.loads(done.read_text())["seconds"]
        return GRPORun(run_dir, run_dir / "metrics.jsonl", run_dir / "val_generations", seconds)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = grpo_env(config, model, train, val, tool_yaml, url, run_dir)
    max_turn_tokens = 96  # a model turn of the protocol is ~20-40 tokens; cap rambling ones
    overrides = [
        "trainer.val_before_train=True",
        f"trainer.val_only={val_only}",
        f"actor_rollout_ref.rollout.temperature={config.grpo.temperature}",
        f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{max_tokens_per_turn:{max_turn_tokens}}}",
        f"data.seed={config.world.split_seed}",
    ]
    command = ["bash", str(CPU_SCRIPT), *overrides]
    name = "evaluation" if val_only else "GRPO"
    seconds = run_stage(f"{name} {run_dir.name}", command, run_dir.parent / f"{run_dir.name}.log", env)
    with atomic_path(done) as tmp:
        tmp.write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
    return GRPORun(run_dir, run_dir / "metrics.jsonl", run_dir / "val_generations", seconds)
