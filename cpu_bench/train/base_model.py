"""The model stages before SFT: the random initial model (``initial_model/``), then its pre-training on other toy
worlds in two stages (``pretrain_copy/``: copying, then language; ``base_model/``: search trajectories of other worlds).

Invariant: each is a :class:`~cpu_bench.train.stage.Stage` keyed by the settings it reads and the stage it builds
on; the evaluated world (``world_seed``) is never read, only worlds ``world_seed + 1`` onwards (unless
``model.tokenizer_worlds`` is 0, when the tokenizer is learnt on it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from cpu_bench.train.config import SearchSettings, TrainConfig
from cpu_bench.train.sft_data import RowSettings, hop_source, sft_row
from cpu_bench.train.stage import Stage, legacy_seconds

logger = logging.getLogger(__name__)

#: the folders of a run that make up its base model: the initial model (its tokenizer) and the pre-trained model
PARTS = ("initial_model", "base_model")
#: where a base model of the older convention recorded its seconds (beside the folder)
LEGACY_DONE = "base_model.json"


def rendering_digest(rows: RowSettings) -> str:
    """A fingerprint of how rows are rendered (the prompt templates, rendered, the tool's schemas, the turn limit)."""
    probe = "In what year was the probe born?"
    rendering = [rows.hermes_template.render(probe), rows.native_template.render(probe), rows.tool_schemas]
    rendering += [rows.max_turns, rows.final_instruction]
    blob = json.dumps(rendering, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def initial_stage(config: TrainConfig, rows: RowSettings, out: Path) -> Stage:
    """``out/initial_model``: the random model and its tokenizer, learnt on other worlds' text unless
    ``model.tokenizer_worlds`` is 0."""
    from cpu_bench.train.initial_model import tokenizer_texts, write_initial_model

    first, worlds = config.world.world_seed + 1, config.model.tokenizer_worlds
    if worlds:
        seeds, passages, cache = list(range(first, first + worlds)), config.pretrain.task_passages, "other_worlds"
    else:
        seeds, passages, cache = [config.world.world_seed], config.world.passages, "toy_world"
    key = {"model": config.model.model_dump(mode="json"), "worlds": seeds, "passages": passages}
    key["rows"] = rendering_digest(rows)

    def build(folder: Path) -> None:
        templates = (rows.native_template, rows.hermes_template)
        texts = tokenizer_texts(seeds, passages, templates, out / cache)
        texts += [json.dumps(rows.tool_schemas, default=str)] * 50
        write_initial_model(folder, texts, config.model)

    return Stage("initial model", out / "initial_model", key, build, legacy_seconds("config.json"))


def _copy_stage(config: TrainConfig, initial: Stage, out: Path) -> Stage:
    """``out/pretrain_copy``: copying, then language modelling on world ``world_seed + 1``."""
    from cpu_bench.train.initial_model import corpus_texts
    from cpu_bench.train.other_worlds import world_dataset
    from cpu_bench.train.pretrain import pretrain

    p, seed = config.pretrain, config.world.world_seed + 1
    key = {"initial": initial.digest, "world": seed, **p.model_dump(include={"copy_steps", "lm_steps", "lm_passages"})}
    key["lr"] = p.lr

    def build(folder: Path) -> dict[str, Any]:
        world = world_dataset(seed, p.lm_passages, out / "other_worlds")
        stats = pretrain(initial.folder, folder, corpus_texts(world.corpus_path), p)
        logger.info("copying + language pre-training: %s", stats)
        return stats

    return Stage("copy and language pre-training", out / "pretrain_copy", key, build, legacy_seconds("config.json"))


def world_rows(config: TrainConfig, settings: RowSettings, tokenizer, world_seed: int, cache_dir: Path) -> list[tuple]:
    """``(ids, loss mask)`` of every oracle trajectory of toy world ``world_seed`` (``pretrain.task_passages``
    passages), laid out as the native SFT rows are."""
    from cpu_bench.train.other_worlds import oracle_trajectories
    from cpu_bench.train.sft_dataset import native_token_layout

    rows = []
    for t in oracle_trajectories(world_seed, config.pretrain.task_passages, config.search.max_result_chars, cache_dir):
        row = sft_row(t, "native", settings, hop_source(t.hops))
        prompt = [m for m in row["messages"] if m["role"] != "assistant"]
        rows.append(native_token_layout(tokenizer, prompt, row["segments"]))
    return rows


def trajectory_rows(config: TrainConfig, settings: RowSettings, tokenizer, cache_dir: Path) -> list[tuple]:
    """``(ids, loss mask)`` of every trajectory the base model trains on: worlds ``world_seed + 1`` onwards."""
    rows = []
    for offset in range(1, config.pretrain.task_worlds + 1):
        rows += world_rows(config, settings, tokenizer, config.world.world_seed + offset, cache_dir)
    return rows


def base_stage(config: TrainConfig, rows: RowSettings, out: Path) -> Stage:
    """``out/base_model`` (the model SFT starts from): the copy stage's model trained on other worlds' search
    trajectories; its build runs the copy stage first (reused when done)."""
    from cpu_bench.train.pretrain import train_on_trajectories

    copied = _copy_stage(config, initial_stage(config, rows, out), out)
    p = config.pretrain
    # the search settings, with the SFT-only ones at their defaults: the key keeps its shape, so base models built
    # before still match, and one restored into a run with other SFT-only settings is not rebuilt
    search = config.search.model_dump(mode="json")
    search |= SearchSettings().model_dump(mode="json", include=set(SearchSettings.SFT_ONLY))
    key = {"copy": copied.digest, "rows": rendering_digest(rows), "search": search}
    key |= p.model_dump(include={"task_worlds", "task_passages", "task_steps", "lr"})

    def build(folder: Path) -> dict[str, Any]:
        from transformers import AutoTokenizer

        logger.info(
            "building the base model: the longest stage (10-17 min on 2 CPU cores), once per machine for these "
            "settings (the defaults' is shipped in the repository): later runs with the same base-model settings "
            "restore it (cpu_bench.train.base_cache)"
        )
        copied.ensure()
        tokenizer = AutoTokenizer.from_pretrained(copied.folder)
        trajectories = trajectory_rows(config, rows, tokenizer, out / "other_worlds")
        stats = train_on_trajectories(copied.folder, folder, trajectories, p)
        logger.info("pre-training on other worlds' trajectories: %s", stats)
        return stats

    legacy = legacy_seconds("config.json", f"../{LEGACY_DONE}", required=True)
    return Stage("base model", out / "base_model", key, build, legacy)


def build_base_model(config: TrainConfig, initial: Path, rows: RowSettings, out: Path) -> tuple[Path, float]:
    """The model SFT starts from and the seconds its stages took (when they were built): ``initial`` when
    pre-training is off, ``out/pretrain_copy`` when there are no trajectory steps, else ``out/base_model``."""
    if not config.pretrain.enabled:
        return initial, 0.0
    p = config.pretrain
    if not (p.task_steps and p.task_worlds):
        copied = _copy_stage(config, initial_stage(config, rows, out), out)
        return copied.folder, copied.ensure().seconds
    return out / "base_model", base_stage(config, rows, out).ensure().seconds
