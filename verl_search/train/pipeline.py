"""``make train`` end to end: retriever, data, initial model, base model (pre-trained on other toy worlds), SFT warm
start, the answer-only baseline, GRPO, evaluation through ``verl_search.report``, plots, and the before/after table.

Invariant: every stage writes under ``out_dir`` only, atomically; finished stages are reused, only under the settings
that built them (``run_settings``; so ``make demo`` can start from a cached warm start), and the table's numbers
come from verl's validation dumps of the held-out questions.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.train import base_cache
from verl_search.train.base_model import build_base_model
from verl_search.train.config import TrainConfig
from verl_search.train.data_stage import prepare_data, row_settings
from verl_search.train.initial_model import tokenizer_texts, write_initial_model
from verl_search.train.processes import retriever, run_stage
from verl_search.train.run_settings import check_and_record
from verl_search.train.sft_data import RowSettings
from verl_search.train.stages import GRPORun, run_grpo, run_sft
from verl_search.train.summary import StageResult, as_dicts, render_table, stage_result
from verl_search.train.tiny_model import TinyModelSpec

logger = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    """What ``make train`` produced: the table's rows, timings and every artifact's path."""

    results: list[StageResult]
    seconds: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)


def _initial_model(config: TrainConfig, settings: RowSettings, out: Path) -> Path:
    """The random initial model and its tokenizer (``initial_model``), learnt on other worlds' text unless
    ``model.tokenizer_worlds`` is 0."""
    if (out / "config.json").is_file():
        return out
    first, worlds = config.world.world_seed + 1, config.model.tokenizer_worlds
    templates = (settings.native_template, settings.hermes_template)
    if worlds:
        seeds, passages = range(first, first + worlds), config.pretrain.task_passages
        texts = tokenizer_texts(seeds, passages, templates, out.parent / "other_worlds")
    else:
        texts = tokenizer_texts([config.world.world_seed], config.world.passages, templates, out.parent / "toy_world")
    texts += [json.dumps(settings.tool_schemas, default=str)] * 50
    sizes = TinyModelSpec(**config.model.model_dump(exclude={"vocab_size", "tokenizer_worlds"}))
    return write_initial_model(out, texts, sizes, config.model.vocab_size)


def _sft_label(stats: dict) -> str:
    """What the warm start was trained on, for the table."""
    direct = stats.get("sft_answered_without_search", 0)
    searched = f"SFT: {stats['sft_trajectories']} questions searched"
    return f"{searched}, {direct} answered from memory" if direct else searched


def _report(run: GRPORun, val_data: Path, log: Path) -> Path:
    """``python -m verl_search.report`` on the run's latest validation dump (writes report.md/json there)."""
    command = [sys.executable, "-m", "verl_search.report", str(run.val_dir), "--data", str(val_data)]
    run_stage("report", command, log)
    return run.val_dir / "report.md"


def run_pipeline(config: TrainConfig, redo_grpo: bool = False) -> PipelineResult:
    """Run every stage (see the module docstring); raises StageError naming the stage that failed. ``redo_grpo``:
    delete a finished GRPO stage first (``make demo``), once the folder's settings are checked."""
    from verl_search.eval.plots import plot_training

    out = Path(config.out_dir).resolve()
    check_and_record(config, out, redo_grpo)  # before anything runs: a folder built with other settings is refused
    if redo_grpo:
        shutil.rmtree(out / "grpo", ignore_errors=True)
    logs = out / "logs"
    seconds: dict[str, float] = {}
    started = time.monotonic()
    with retriever(config.retriever_url, config.world.passages, logs / "retriever.log") as url:
        seconds["retriever_start"] = time.monotonic() - started
        t = time.monotonic()
        data = prepare_data(config, url, out / "data", logs)
        settings = row_settings(config, data.tool_yaml)
        restored = base_cache.restore(config, settings, out)  # a base model built by another run folder on this machine
        model0 = _initial_model(config, settings, out / "initial_model")
        seconds["data_and_initial_model"] = time.monotonic() - t
        model0, seconds["base_model"] = build_base_model(config, model0, settings, out)
        if restored:
            seconds["base_model"] = 0.0  # its build time is the other run's
        cached = restored or base_cache.store(config, settings, out)
        sft_model, seconds["sft"] = run_sft(config, data.sft, model0, out / "sft", config.sft.epochs)
        results: list[StageResult] = []
        artifacts: dict[str, str] = {"sft_model": str(sft_model)}
        if cached:
            artifacts["base_model_cache"] = str(cached)
        if config.baseline:
            base_model, seconds["sft_answer_only"] = run_sft(
                config, data.baseline_sft, model0, out / "sft_answer_only", config.sft.baseline_epochs
            )
            base_dir = out / "eval_answer_only"
            base = run_grpo(config, base_model, data.rl, data.eval, data.tool_yaml, url, base_dir, val_only=True)
            seconds["eval_answer_only"] = base.seconds
            what = "SFT on answers only (no search turns)"
            results.append(stage_result("no-search baseline", what, base.val_dir, data.eval))
            artifacts["answer_only_model"] = str(base_model)
        grpo = run_grpo(config, sft_model, data.rl, data.eval, data.tool_yaml, url, out / "grpo")
        seconds["grpo"] = grpo.seconds
    report = _report(grpo, data.eval, logs / "report.log")
    results += [
        stage_result("after SFT", _sft_label(data.stats), grpo.val_dir, data.eval, step=0),
        stage_result("after GRPO", f"GRPO, {config.grpo.steps} steps", grpo.val_dir, data.eval),
    ]
    plots = plot_training(grpo.metrics, out / "plots", title=f"GRPO on the toy world ({config.grpo.steps} steps)")
    seconds["total"] = time.monotonic() - started
    artifacts.update(
        grpo_checkpoint=str(grpo.run_dir / "checkpoints"),
        report=str(report),
        plots=str(out / "plots"),
        metrics=str(grpo.metrics),
        validation_dumps=str(grpo.val_dir),
    )
    result = PipelineResult(results, seconds, artifacts)
    with atomic_path(out / "summary.json") as tmp:
        summary = {"results": as_dicts(results), "seconds": seconds, "artifacts": artifacts, "data": data.stats}
        tmp.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text(render_table(results), encoding="utf-8")
    logger.info("plots: %s", [str(p) for p in plots])
    return result
