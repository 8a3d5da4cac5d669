"""The encoder's start-up precision probes, remembered per machine: the float32 and bfloat16 timings of one model on
one CPU (and, where int8 contends, the int8 and float encoders' timings) are measured once and reused by every later
start (every restart and every replica of a fleet used to repeat them, and a probe taken while the machine is busy can
flip the choice from one start to the next). The flat scan's layout probe (``index.scan_layout``) is kept the same
way, in a file of its own.

Invariants: an entry is reused only for the same model (its path and config), CPU (model name and bf16 flags), torch
version and thread count; the file is replaced atomically and keeps the newest :data:`MAX_ENTRIES` probes; an
unreadable or foreign file is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import torch

from local_dense_retriever.config import default_cache_dir
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

FILE_NAME = "encoder_precision_probes.json"
FORMAT = 1
#: the most probes kept, the oldest dropped first (each model path is a key: temporary copies of a model, as tests
#: make, would otherwise grow the file for ever)
MAX_ENTRIES = 64


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or "unknown cpu"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"


def probe_key(model_name_or_path: str | Path, model_config: str, flags: list[str]) -> str:
    """What a probe's result depends on, hashed."""
    parts = [str(model_name_or_path), model_config, cpu_model(), "+".join(sorted(flags)), torch.__version__,
             str(torch.get_num_threads())]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _path(cache_dir: Path | None, file_name: str = FILE_NAME) -> Path:
    return (cache_dir or default_cache_dir()) / file_name


def _entries(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("probes"), dict):
        return {}
    return data["probes"]


def cached_timings(
    key: str,
    cache_dir: Path | None = None,
    names: tuple[str, ...] = ("float32", "bfloat16"),
    file_name: str = FILE_NAME,
    what: str = "the encoder precision",
) -> dict[str, float] | None:
    """The timings (seconds per probe batch, one per name in ``names``) measured earlier for ``key``, or None.
    ``file_name``: the file of one kind of probe (the flat scan's layout keeps its own); ``what`` it decides, for the
    log."""
    entry = _entries(_path(cache_dir, file_name)).get(key)
    if not isinstance(entry, dict):
        return None
    timings = entry.get("timings")
    if not isinstance(timings, dict) or not all(isinstance(timings.get(k), float) for k in names):
        return None
    logger.info("reusing the timings measured on this machine at %s for %s", entry.get("measured"), what)
    return {k: timings[k] for k in names}


def remember(
    key: str,
    timings: dict[str, float],
    cache_dir: Path | None = None,
    file_name: str = FILE_NAME,
    what: str = "encoder precision probe",
) -> None:
    """Store ``timings`` for ``key`` (a cache that cannot be written is only logged: the probe ran anyway)."""
    path = _path(cache_dir, file_name)
    probes = _entries(path)
    probes.pop(key, None)  # the newest last
    probes[key] = {"timings": timings, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    probes = dict(list(probes.items())[-MAX_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"format": FORMAT, "probes": probes}, indent=1), encoding="utf-8")
    except OSError as e:
        logger.warning("%s: cannot cache the timings in %s: %s", what, path, e)
