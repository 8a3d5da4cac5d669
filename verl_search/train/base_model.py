"""The base-model stage of ``make train``: the random initial model pre-trained on other toy worlds, in two cached
steps (``pretrain_copy/``: copying, then language; ``base_model/``: search trajectories of other worlds).

Invariant: both folders are written atomically and reused when present; the evaluated world (``world_seed``) is never
read, only worlds ``world_seed + 1`` onwards.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.train.config import TrainConfig
from verl_search.train.sft_data import RowSettings, hop_source, sft_row

logger = logging.getLogger(__name__)


def trajectory_rows(config: TrainConfig, settings: RowSettings, tokenizer, cache_dir: Path) -> list[tuple]:
    """``(ids, loss mask)`` of every other-world trajectory, laid out as the native SFT rows are."""
    from verl_search.train.other_worlds import oracle_trajectories
    from verl_search.train.sft_dataset import native_token_layout

    p, rows = config.pretrain, []
    for offset in range(1, p.task_worlds + 1):
        seed = config.world.world_seed + offset
        for t in oracle_trajectories(seed, p.task_passages, config.search.max_result_chars, cache_dir):
            row = sft_row(t, "native", settings, hop_source(t.hops))
            prompt = [m for m in row["messages"] if m["role"] != "assistant"]
            rows.append(native_token_layout(tokenizer, prompt, row["segments"]))
    return rows


def build_base_model(config: TrainConfig, initial: Path, settings: RowSettings, out: Path) -> tuple[Path, float]:
    """``out/base_model`` (the model SFT starts from) and the seconds it took (0 when reused)."""
    from transformers import AutoTokenizer

    from verl_search.train.initial_model import corpus_texts
    from verl_search.train.other_worlds import world_dataset
    from verl_search.train.pretrain import PretrainSpec, TaskSpec, pretrain, train_on_trajectories

    p = config.pretrain
    if not p.enabled:
        return initial, 0.0
    copied, base, done = out / "pretrain_copy", out / "base_model", out / "base_model.json"
    if (base / "config.json").is_file():
        logger.info("reusing %s", base)
        return base, json.loads(done.read_text())["seconds"] if done.is_file() else 0.0
    started, worlds = time.monotonic(), out / "other_worlds"
    logger.info(
        "building the base model: the longest stage (about 10 min on 2 CPU cores at the defaults), once per "
        "machine: later runs with the same base-model settings restore it (verl_search.train.base_cache)"
    )
    if not (copied / "config.json").is_file():
        seed = config.world.world_seed + 1
        world = world_dataset(seed, p.lm_passages, worlds)
        stats = pretrain(
            initial, copied, corpus_texts(world.corpus_path), PretrainSpec(p.copy_steps, lm_steps=p.lm_steps, lr=p.lr)
        )
        logger.info("copying + language pre-training: %s", stats)
    if not (p.task_steps and p.task_worlds):
        return copied, time.monotonic() - started
    tokenizer = AutoTokenizer.from_pretrained(copied)
    rows = trajectory_rows(config, settings, tokenizer, worlds)
    stats = train_on_trajectories(copied, base, rows, TaskSpec(steps=p.task_steps, lr=p.lr))
    logger.info("pre-training on other worlds' trajectories: %s", stats)
    seconds = time.monotonic() - started
    with atomic_path(done) as tmp:
        tmp.write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
    return base, seconds
