"""The machine-wide cache of base models (``$VERL_SEARCH_CACHE/base_models/<key>/``), shared by every run folder.

The base-model stage is most of ``make train``'s time (about 10 of 21 minutes) and depends on none of the question
split, the SFT or GRPO settings: ``make train --seed 1``, a run in another ``--out`` and ``make demo`` all start from
the same base model, so it is built once per machine and copied into each run folder, which stays self-contained.

Invariant: an entry is keyed by every setting that the initial model and the base-model stage read (``model.*``,
``pretrain.*``, the search settings that shape a trajectory, ``world.world_seed``, and ``world.passages`` when the
tokenizer is learnt on the evaluated world), by the rows' rendering (the shipped prompt templates, rendered, and the
tool's schemas) and by :data:`FORMAT`, which changes whenever the code that builds a base model changes what it
builds. An entry is written atomically (complete or absent); one that is incomplete (cut short by hand) is never
restored and is replaced by the next store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.train.config import TrainConfig
from verl_search.train.run_settings import settings_of
from verl_search.train.sft_data import RowSettings

logger = logging.getLogger(__name__)

#: the version of what a base model is made of; bump it with any change to how one is built
FORMAT = 1
#: the folders of a run that make up its base model: the initial model (its tokenizer) and the pre-trained model
PARTS = ("initial_model", "base_model")
DONE = "base_model.json"
ENV_DISABLE = "VERL_SEARCH_NO_BASE_CACHE"


#: search settings that shape the SFT data only, never the other worlds' trajectories the base model trains on
_SFT_ONLY = {"search.hermes_share", "search.no_search_share"}


def base_settings(config: TrainConfig, rows: RowSettings) -> dict:
    """The settings a base model depends on, the rendered rows' fingerprint included."""
    wanted = ("model.", "pretrain.", "search.")
    chosen = {k: v for k, v in settings_of(config).items() if k.startswith(wanted) and k not in _SFT_ONLY}
    chosen["world.world_seed"] = config.world.world_seed
    if config.model.tokenizer_worlds == 0:  # the tokenizer is then learnt on the evaluated world's corpus
        chosen["world.passages"] = config.world.passages
    probe = "In what year was the probe born?"
    rendering = [rows.hermes_template.render(probe), rows.native_template.render(probe), rows.tool_schemas]
    rendering += [rows.max_turns, rows.final_instruction]
    blob = json.dumps(rendering, sort_keys=True, default=str)
    chosen["rows"] = hashlib.sha256(blob.encode()).hexdigest()[:16]
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


def _complete(folder: Path) -> bool:
    return all((folder / part / "config.json").is_file() for part in PARTS) and (folder / DONE).is_file()


def restore(config: TrainConfig, rows: RowSettings, out: Path) -> Path | None:
    """Copy the cached base model of ``config`` into the run folder ``out`` when the folder has none; returns the
    cache entry it came from, or None.

    A folder that already holds a base model keeps it (it was built under the settings ``run_settings`` checked)."""
    root = cache_root()
    if root is None or not config.pretrain.enabled or (out / "base_model" / "config.json").is_file():
        return None
    entry = root / base_key(config, rows)
    if not _complete(entry):
        return None
    for part in PARTS:
        shutil.rmtree(out / part, ignore_errors=True)
        with atomic_path(out / part) as tmp:
            shutil.copytree(entry / part, tmp)
    with atomic_path(out / DONE) as tmp:
        shutil.copyfile(entry / DONE, tmp)
    logger.info("base model restored from the machine-wide cache %s", entry)
    return entry


def store(config: TrainConfig, rows: RowSettings, out: Path) -> Path | None:
    """Copy the run folder's base model into the cache (if it is complete and not cached yet); returns the entry.

    A failure to write the cache (a full or read-only disk) is logged, never raised: it costs only a rebuild later.
    """
    root = cache_root()
    if root is None or not config.pretrain.enabled or not _complete(out):
        return None
    entry = root / base_key(config, rows)
    if _complete(entry):
        return entry
    try:
        if entry.exists():  # entries are written atomically: an incomplete one was cut short outside this code
            shutil.rmtree(entry)
        with atomic_path(entry) as tmp:
            tmp.mkdir()
            for part in PARTS:
                shutil.copytree(out / part, tmp / part)
            shutil.copyfile(out / DONE, tmp / DONE)
            (tmp / "settings.json").write_text(json.dumps(base_settings(config, rows), indent=2, sort_keys=True))
    except OSError as e:  # another run stored it first, or the disk refused: the run folder has its own copy
        if _complete(entry):
            return entry
        logger.warning("could not cache the base model in %s: %s", entry, e)
        return None
    logger.info("base model cached in %s for other run folders", entry)
    return entry
