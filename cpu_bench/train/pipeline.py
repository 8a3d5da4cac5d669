"""``make train`` end to end: retriever, data, initial model, base model (pre-trained on other toy worlds), SFT warm
start, the answer-only baseline, GRPO, the evaluation report (``verl_search.report``), plots, and the
before/after table. The package's functions are called directly; only the trainers (verl's, in Ray) and the retriever
run as child processes.

Invariant: every stage writes under ``out_dir`` only, atomically; finished stages are reused, only under the settings
that built them (``run_settings``, and each stage's key: ``cpu_bench.train.stage``; so ``make demo`` can start from
a cached warm start), and the table's numbers come from verl's validation dumps of the held-out questions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cpu_bench.train import base_cache, shipped_base
from cpu_bench.train.base_model import base_stage, build_base_model, initial_stage
from cpu_bench.train.config import TrainConfig
from cpu_bench.train.data_stage import data_key, prepare_data, row_settings
from cpu_bench.train.processes import retrieval_server, retriever
from cpu_bench.train.progress import PACE, Progress, base_model_seconds, grpo_seconds, sft_seconds, stage_count
from cpu_bench.train.run_settings import check_and_record
from cpu_bench.train.stage import digest
from cpu_bench.train.stages import GRPORun, run_grpo, run_sft, sft_stage
from cpu_bench.train.summary import Gain, StageResult, as_dicts, paired_gain, render_table, stage_result
from cpu_bench.train.toy_web import search_service, web_report
from verl_search.atomic import atomic_path
from verl_search.eval.plots import Panel, plot_panels
from verl_search.report import write_report

logger = logging.getLogger(__name__)

#: GRPO's training curves, a PNG each and all four in ``training_curves.png``
TRAINING_PANELS = (
    Panel("Reward (= EM) per step", "EM", (r"^critic/score/mean$", r"^val-core/(.+)/reward/mean@1$"), "reward_em.png"),
    Panel(
        "Searches per question",
        "searches",
        (r"^num_searches/mean$", r"^val-aux/(.+)/num_searches/mean@1$"),
        "searches.png",
    ),
    Panel("Response length", "tokens", (r"^response_length/mean$",), "response_length.png"),
    Panel(
        "Failed searches per question",
        "failed searches",
        (r"^failed_searches/mean$", r"^val-aux/(.+)/failed_searches/mean@1$"),
        "failed_searches.png",
    ),
)


@dataclass
class PipelineResult:
    """What ``make train`` produced: the table's rows, timings and every artifact's path."""

    results: list[StageResult]
    seconds: dict[str, float] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    gain: Gain | None = None  # EM after GRPO minus after SFT, paired over the held-out questions
    #: stages this run did not build, and where they came from (their ``seconds`` are from when they were built)
    reused: dict[str, str] = field(default_factory=dict)
    web: dict | None = None  # --search web|web-replay: the web backend's counters (toy_web.web_report)


def _sft_label(stats: dict) -> str:
    """What the warm start was trained on, for the table."""
    direct = stats.get("sft_answered_without_search", 0)
    searched = f"SFT: {stats['sft_trajectories']} questions searched"
    return f"{searched}, {direct} answered from memory" if direct else searched


def _report(run: GRPORun, val_data: Path) -> Path:
    """The report of the run's latest validation dump (what ``python -m verl_search.report`` writes there)."""
    report, step, _ = write_report(run.val_dir, val_data)
    logger.info("report of step %d: %s", step, run.val_dir / "report.md")
    return run.val_dir / "report.md"


def _announce_base_model(progress: Progress, config: TrainConfig, rows, out: Path, restored: Path | None) -> str:
    """Say what the base-model stage will do; returns where a base model not built by this run comes from, or ''."""
    if not config.pretrain.enabled:
        progress.stage("base model", "none, SFT starts from the random initial model", None)
    elif restored is not None:
        progress.stage("base model", f"restored from {restored}", None)
        return f"restored from {restored}"
    elif base_stage(config, rows, out).done() is not None:
        progress.stage("base model", f"built before in {out / 'base_model'}", None)
        return "built before"
    else:
        what = "pre-training on other toy worlds (copying, language, search trajectories), once per machine"
        progress.stage("base model", what, base_model_seconds(config))
    return ""


def run_pipeline(config: TrainConfig, redo_grpo: bool = False) -> PipelineResult:
    """Run every stage (see the module docstring); raises StageError naming the stage that failed. ``redo_grpo``:
    delete a finished GRPO stage first (``make demo``), once the folder's settings are checked."""
    out = Path(config.out_dir).resolve()
    check_and_record(config, out, redo_grpo)  # before anything runs: a folder built with other settings is refused
    if redo_grpo:
        shutil.rmtree(out / "grpo", ignore_errors=True)
    logs = out / "logs"
    seconds: dict[str, float] = {}
    reused: dict[str, str] = {}
    started = time.monotonic()
    progress = Progress(stage_count(config))
    if config.search_backend != "dense":
        what, expected = f"the toy world's web ({config.search_backend}) on 127.0.0.1", PACE.retriever_start + PACE.data
    elif config.retriever_url is None:
        what, expected = "the toy world's MiniLM index and retriever on 127.0.0.1", PACE.retriever_start + PACE.data
    else:
        what, expected = f"the retriever at {config.retriever_url}", PACE.data
    progress.stage("retriever and data", what + ", the question splits, the SFT trajectories", expected)
    with _search(config, out, logs) as url:
        seconds["retriever_start"] = time.monotonic() - started
        t = time.monotonic()
        data = prepare_data(config, url, out / "data")
        settings = row_settings(config, data.rows_tool_yaml)
        restored = base_cache.restore(config, settings, out)  # a base model built by another run folder on this machine
        if restored is None and shipped_base.restore(config, settings, out):  # else the repository's, when it fits
            restored = shipped_base.SHIPPED
        if origin := _announce_base_model(progress, config, settings, out, restored):
            reused["base_model"] = origin
        model0 = initial_stage(config, settings, out)
        model0.ensure()
        seconds["data_and_initial_model"] = time.monotonic() - t
        model0, seconds["base_model"] = build_base_model(config, model0.folder, settings, out)
        if restored:
            seconds["base_model"] = 0.0  # its build time is the other run's
        cached = restored or base_cache.store(config, settings, out)
        # what the SFT and GRPO stages build on, by key: the data stage's and the base model's (the cache's key)
        inputs = {"data": digest(data_key(config)), "base_model": base_cache.base_key(config, settings)}
        sft_rows = data.stats.get("sft_trajectories", 0) + data.stats.get("sft_answered_without_search", 0)
        if sft_stage(config, data.sft, model0, out / "sft", config.sft.epochs, inputs).done() is not None:
            progress.stage("SFT warm start", f"built before in {out / 'sft'}", None)
            reused["sft"] = "built before"
        else:
            epochs = f"{config.sft.epochs} epoch" + ("s" if config.sft.epochs > 1 else "")
            what = f"verl's SFT trainer on {sft_rows} trajectories, {epochs}"
            progress.stage("SFT warm start", what, sft_seconds(sft_rows, config, config.sft.epochs))
        sft_model, seconds["sft"] = run_sft(config, data.sft, model0, out / "sft", config.sft.epochs, inputs)
        results: list[StageResult] = []
        artifacts: dict[str, str] = {"sft_model": str(sft_model)}
        if cached:
            artifacts["base_model_cache"] = str(cached)
        if config.baseline:
            rows = config.world.sft_questions
            expected = sft_seconds(rows, config, config.sft.baseline_epochs) + grpo_seconds(config, val_only=True)
            progress.stage("no-search baseline", "SFT on answers only, then its held-out evaluation", expected)
            base_model, seconds["sft_answer_only"] = run_sft(
                config, data.baseline_sft, model0, out / "sft_answer_only", config.sft.baseline_epochs, inputs
            )
            base_dir = out / "eval_answer_only"
            base_inputs = {**inputs, "model": "sft_answer_only", "sft": config.sft.model_dump(mode="json")}
            base = run_grpo(
                config, base_model, data.rl, data.eval, data.tool_yaml, base_dir, val_only=True, key=base_inputs
            )
            seconds["eval_answer_only"] = base.seconds
            what = "SFT on answers only (no search turns)"
            results.append(stage_result("no-search baseline", what, base.val_dir, data.eval))
            artifacts["answer_only_model"] = str(base_model)
        g = config.grpo
        what = (
            f"verl's main_ppo, {g.steps} steps of {g.batch_size} questions x {g.rollout_n} samples ({g.rollout}), the "
            f"{config.world.eval_questions} held-out questions validated every {g.test_freq} steps and at step 0"
        )
        progress.stage("GRPO", what, grpo_seconds(config))
        grpo_inputs = {**inputs, "model": "sft", "sft": config.sft.model_dump(mode="json")}
        grpo = run_grpo(config, sft_model, data.rl, data.eval, data.tool_yaml, out / "grpo", key=grpo_inputs)
        seconds["grpo"] = grpo.seconds
        if grpo.reused:
            reused["grpo"] = "built before"
        web = web_report(url) if config.search_backend != "dense" else None
    report = _report(grpo, data.eval)
    results += [
        stage_result("after SFT", _sft_label(data.stats), grpo.val_dir, data.eval, step=0),
        stage_result("after GRPO", f"GRPO, {config.grpo.steps} steps", grpo.val_dir, data.eval),
    ]
    title = f"GRPO on the toy world ({config.grpo.steps} steps)"
    plots = plot_panels(grpo.metrics, out / "plots", TRAINING_PANELS, "training_curves.png", title)
    seconds["total"] = time.monotonic() - started
    artifacts.update(
        grpo_checkpoint=str(grpo.run_dir / "checkpoints"),
        report=str(report),
        plots=str(out / "plots"),
        metrics=str(grpo.metrics),
        validation_dumps=str(grpo.val_dir),
    )
    result = PipelineResult(results, seconds, artifacts, gain=paired_gain(grpo.val_dir), reused=reused, web=web)
    write_summary(out, result, data.stats)
    logger.info("plots: %s", [str(p) for p in plots])
    return result


@contextlib.contextmanager
def _search(config: TrainConfig, out: Path, logs: Path) -> Iterator[str]:
    """The ``/retrieve`` URL every stage searches (``config.search_backend``), for the whole run."""
    if config.world.kind == "pages" and config.retriever_url is None:
        from local_dense_retriever.toy.pages_world import generate_pages_world, server_flags

        world = generate_pages_world(out / "pages", config.world.passages, config.world.world_seed)
        with retrieval_server(server_flags(world), logs / "retriever.log") as base:
            yield base + "/retrieve"
        return
    if config.search_backend == "dense":
        with retriever(config.retriever_url, config.world.passages, logs / "retriever.log") as url:
            yield url
        return
    cache = Path(config.web_cache) if config.web_cache is not None else out / "web_search.sqlite3"
    with search_service(config.search_backend, cache, config.world.passages, logs, scope=out.name) as url:
        yield url


def write_summary(out: Path, result: PipelineResult, data_stats: dict) -> None:
    """``summary.json`` (what ``make train-seeds`` and the README's tables read) and ``summary.md`` (the table)."""
    with atomic_path(out / "summary.json") as tmp:
        summary = {"results": as_dicts(result.results), "seconds": result.seconds, "reused": result.reused}
        summary |= {"artifacts": result.artifacts, "data": data_stats, "grpo_gain": asdict(result.gain)}
        if result.web is not None:  # --search web|web-replay: the web backend's calls and what its cache saved
            summary["web_search"] = result.web
        tmp.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text(render_table(result.results, result.gain), encoding="utf-8")
