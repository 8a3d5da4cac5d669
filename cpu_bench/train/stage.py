"""One stage of ``make train`` (data, initial model, base model, SFT, GRPO, the base-model cache entry): a name, the
inputs that key it, an output folder, a done marker and a build function; reused while its key is unchanged.

Invariant: a stage's folder counts as done only when its marker ``stage.json`` (written last, atomically) holds the
key of the inputs now, or when the folder was finished under an older convention (``legacy``: ``done.json``,
``config.json``), which ``run_settings`` checked against the folder's settings. Anything else (no marker, another key,
a build cut short) is deleted and built again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

#: the done marker inside every stage folder: ``{"stage", "key", "seconds", "info"}``
MARKER = "stage.json"


@dataclass(frozen=True)
class StageRecord:
    """A finished stage: the seconds its build took (when it was built, also on reuse), what the build reported,
    and whether this call reused it."""

    seconds: float
    info: dict[str, Any] = field(default_factory=dict)
    reused: bool = False


#: reads a folder finished under an older convention: its record, or None when it is not one
Legacy = Callable[[Path], "StageRecord | None"]


def normalised(key: Mapping[str, Any]) -> dict[str, Any]:
    """``key`` as it reads back from JSON (tuples become lists, paths strings), so a stored key compares equal."""
    return json.loads(json.dumps(dict(key), sort_keys=True, default=str))


def digest(key: Mapping[str, Any]) -> str:
    """A short stable fingerprint of ``key`` (how a stage names the stages it builds on in its own key)."""
    return hashlib.sha256(json.dumps(normalised(key), sort_keys=True).encode()).hexdigest()[:16]


def legacy_seconds(done_file: str, seconds_file: str | None = None, *, required: bool = False) -> Legacy:
    """An older convention: the folder is done when ``done_file`` exists in it (and ``seconds_file`` too when
    ``required``); the seconds are in ``seconds_file`` (relative to the folder, ``{"seconds": s}``), else 0."""

    def read(folder: Path) -> StageRecord | None:
        source = folder / seconds_file if seconds_file else None
        if not (folder / done_file).is_file() or (required and not (source and source.is_file())):
            return None
        seconds = json.loads(source.read_text())["seconds"] if source is not None and source.is_file() else 0.0
        return StageRecord(float(seconds), reused=True)

    return read


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder``, or None when there is none or it is unreadable (then the stage is not done)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def write_marker(folder: Path, name: str, key: Mapping[str, Any], seconds: float, info: Mapping | None = None) -> None:
    """Mark ``folder`` done for ``key`` (atomically; the last write of a build)."""
    marker = {"stage": name, "key": normalised(key), "seconds": seconds, "info": dict(info or {})}
    with atomic_path(Path(folder) / MARKER) as tmp:
        tmp.write_text(json.dumps(marker, indent=2, sort_keys=True, default=str), encoding="utf-8")


@dataclass(frozen=True)
class Stage:
    """A stage: ``build(folder)`` writes the stage's outputs into the (fresh, empty) ``folder`` and may return a dict
    to record (read back as ``StageRecord.info``); ``key`` holds every input that decides what it builds."""

    name: str
    folder: Path
    key: Mapping[str, Any]
    build: Callable[[Path], Mapping[str, Any] | None]
    legacy: Legacy | None = None
    #: build in a temporary folder beside ``folder`` and rename it into place with its marker (for a folder several
    #: processes may write, like a cache entry); otherwise in place (verl's runs record their own paths)
    staged: bool = False

    @property
    def digest(self) -> str:
        return digest(self.key)

    def done(self) -> StageRecord | None:
        """The record of a finished folder built with this key (or under the older convention), else None."""
        marker = read_marker(self.folder)
        if marker is not None:
            if marker.get("key") != normalised(self.key):
                return None
            return StageRecord(float(marker.get("seconds", 0.0)), dict(marker.get("info") or {}), reused=True)
        return self.legacy(self.folder) if self.legacy is not None and self.folder.is_dir() else None

    def ensure(self) -> StageRecord:
        """Reuse the finished folder, or delete what is there and build it; returns the stage's record."""
        record = self.done()
        if record is not None:
            logger.info("%s: reusing %s", self.name, self.folder)
            return record
        if self.folder.exists():
            logger.info("%s: %s is unfinished or was built from other inputs; rebuilding it", self.name, self.folder)
            shutil.rmtree(self.folder)
        started = time.monotonic()
        if not self.staged:
            self.folder.mkdir(parents=True)
            info = dict(self.build(self.folder) or {})
            seconds = time.monotonic() - started
            write_marker(self.folder, self.name, self.key, seconds, info)
            return StageRecord(seconds, info)
        with atomic_path(self.folder) as tmp:
            tmp.mkdir()
            info = dict(self.build(tmp) or {})
            seconds = time.monotonic() - started
            write_marker(tmp, self.name, self.key, seconds, info)
        return StageRecord(seconds, info)
