"""The machine-wide cache of base models (``$VERL_SEARCH_CACHE/base_models/<key>/``), shared by every run folder.

The base-model stage is most of ``make train``'s time (about 10 of 21 minutes) and depends on none of the question
split, the SFT or GRPO settings: ``make train --seed 1``, a run in another ``--out`` and ``make demo`` all start from
the same base model, so it is built once per machine and copied into each run folder, which stays self-contained.

Invariant: an entry is keyed by every setting that the initial model and the base-model stage read (``model.*``,
``pretrain.*``, the search settings that shape a trajectory, ``world.world_seed``, and ``world.passages`` when the
tokenizer is learnt on the evaluated world), by the rows' rendering (the shipped prompt templates, rendered, and the
tool's schemas) and by :data:`FORMAT`, which changes whenever the code that builds a base model changes what it
builds. An entry is a :class:`~cpu_bench.train.stage.Stage` (its marker written last, atomically); one that is
incomplete (cut short by hand) is never restored and is replaced by the next store. Entries of the older convention
(``base_model.json`` beside the parts) are still restored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from cpu_bench.train.base_model import LEGACY_DONE, PARTS, base_stage, initial_stage, rendering_digest
from cpu_bench.train.config import SearchSettings, TrainConfig
from cpu_bench.train.run_settings import settings_of
from cpu_bench.train.sft_data import RowSettings
from cpu_bench.train.stage import Stage, StageRecord, legacy_seconds
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

#: the version of what a base model is made of; bump it with any change to how one is built
FORMAT = 1
ENV_DISABLE = "VERL_SEARCH_NO_BASE_CACHE"


#: search settings that shape the SFT data only, never the other worlds' trajectories the base model trains on
_SFT_ONLY = {f"search.{name}" for name in SearchSettings.SFT_ONLY}


def base_settings(config: TrainConfig, rows: RowSettings) -> dict:
    """The settings a base model depends on, the rendered rows' fingerprint included."""
    wanted = ("model.", "pretrain.", "search.")
    chosen = {k: v for k, v in settings_of(config).items() if k.startswith(wanted) and k not in _SFT_ONLY}
    chosen["world.world_seed"] = config.world.world_seed
    if config.model.tokenizer_worlds == 0:  # the tokenizer is then learnt on the evaluated world's corpus
        chosen["world.passages"] = config.world.passages
    chosen["rows"] = rendering_digest(rows)
    return chosen


def base_key(config: TrainConfig, rows: RowSettings) -> str:
    blob = json.dumps({"format": FORMAT, **base_settings(config, rows)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_root() -> Path | None:
    """``$VERL_SEARCH_CACHE/base_models`` (see ``default_cache_dir``), or None when ``$VERL_SEARCH_NO_BASE_CACHE``
    is set to anything but 0 or empty."""
    from local_dense_retriever.config import default_cache_dir

    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return None
    return default_cache_dir() / "base_models"


def _run_complete(config: TrainConfig, rows: RowSettings, out: Path) -> bool:
    """The run folder's initial and base models are both finished (their stages are done)."""
    return all(stage.done() is not None for stage in (initial_stage(config, rows, out), base_stage(config, rows, out)))


def _entry_stage(config: TrainConfig, rows: RowSettings, entry: Path, source: Path) -> Stage:
    """The cache entry as a stage: built by copying the run folder ``source``'s parts."""

    def build(folder: Path) -> None:
        for part in PARTS:
            shutil.copytree(source / part, folder / part)
        if (source / LEGACY_DONE).is_file():  # a run folder of the older convention: its seconds
            shutil.copyfile(source / LEGACY_DONE, folder / LEGACY_DONE)
        (folder / "settings.json").write_text(json.dumps(base_settings(config, rows), indent=2, sort_keys=True))

    def legacy(folder: Path) -> StageRecord | None:  # an entry stored before stage markers
        if not all((folder / part / "config.json").is_file() for part in PARTS):
            return None
        return legacy_seconds("base_model/config.json", LEGACY_DONE, required=True)(folder)

    key = {"format": FORMAT, **base_settings(config, rows)}
    return Stage("base-model cache entry", entry, key, build, legacy, staged=True)


def restore(config: TrainConfig, rows: RowSettings, out: Path) -> Path | None:
    """Copy the cached base model of ``config`` into the run folder ``out`` when the folder has none; returns the
    cache entry it came from, or None.

    A folder that already holds a base model keeps it (it was built under the settings ``run_settings`` checked)."""
    root = cache_root()
    if root is None or not config.pretrain.enabled or base_stage(config, rows, out).done() is not None:
        return None
    entry = root / base_key(config, rows)
    if _entry_stage(config, rows, entry, out).done() is None:
        return None
    for part in PARTS:
        shutil.rmtree(out / part, ignore_errors=True)
        with atomic_path(out / part) as tmp:
            shutil.copytree(entry / part, tmp)
    if (entry / LEGACY_DONE).is_file():
        with atomic_path(out / LEGACY_DONE) as tmp:
            shutil.copyfile(entry / LEGACY_DONE, tmp)
    logger.info("base model restored from the machine-wide cache %s", entry)
    return entry


def store(config: TrainConfig, rows: RowSettings, out: Path) -> Path | None:
    """Copy the run folder's base model into the cache (if it is complete and not cached yet); returns the entry.

    A failure to write the cache (a full or read-only disk) is logged, never raised: it costs only a rebuild later.
    """
    root = cache_root()
    if root is None or not config.pretrain.enabled or not _run_complete(config, rows, out):
        return None
    stage = _entry_stage(config, rows, root / base_key(config, rows), out)
    try:
        record = stage.ensure()
    except OSError as e:  # another run stored it first, or the disk refused: the run folder has its own copy
        if stage.done() is not None:
            return stage.folder
        logger.warning("could not cache the base model in %s: %s", stage.folder, e)
        return None
    if not record.reused:
        logger.info("base model cached in %s for other run folders", stage.folder)
    return stage.folder
