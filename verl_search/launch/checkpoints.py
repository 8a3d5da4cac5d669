"""verl checkpoint folders as a launch sees them: the latest step in one, the checkpoint a ``RESUME_FROM`` names, and
the run record a launch leaves beside its checkpoints, which says which experiment writes there.

Invariant: only :func:`write_record` writes (atomically, on a real launch); everything else reads. verl's own files
(``latest_checkpointed_iteration.txt``, ``global_step_N/``) are read as verl writes them and never changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.errors import VerlSearchError

#: verl's marker of the newest complete checkpoint in a ``trainer.default_local_dir``
LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"
#: what a launch leaves in its checkpoint folder: the project and experiment that write there
RECORD_FILE = "verl_search_run.json"


class CheckpointError(VerlSearchError, ValueError):
    """A folder named as a checkpoint is not one; the message names the folder and what is missing."""

    kind = "checkpoint"


@dataclass(frozen=True)
class RunRecord:
    """The run a checkpoint folder belongs to."""

    project_name: str
    experiment_name: str


def latest_step(folder: Path) -> int | None:
    """The newest checkpointed step in ``folder`` (verl's marker file, else the highest ``global_step_N``), or None."""
    folder = Path(folder)
    marker = folder / LATEST_FILE
    if marker.is_file():
        text = marker.read_text(encoding="utf-8").strip()
        if text.isdigit():
            return int(text)
    steps = [
        int(p.name.removeprefix(STEP_PREFIX))
        for p in (folder.glob(f"{STEP_PREFIX}*") if folder.is_dir() else [])
        if p.is_dir() and p.name.removeprefix(STEP_PREFIX).isdigit()
    ]
    return max(steps) if steps else None


def resolve_step(path: str | Path) -> Path:
    """The absolute ``global_step_N`` folder that ``path`` names: itself, or a checkpoint folder's latest step."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{path}: no such folder")
    if not folder.name.startswith(STEP_PREFIX):
        step = latest_step(folder)
        if step is None:
            raise CheckpointError(f"{path}: holds no verl checkpoint ({LATEST_FILE} or {STEP_PREFIX}N/)")
        folder = folder / f"{STEP_PREFIX}{step}"
    if not (folder / "actor").is_dir():
        raise CheckpointError(f"{folder}: no actor/ folder (not a verl checkpoint)")
    return folder.resolve()


def read_record(folder: Path) -> RunRecord | None:
    """The run record in ``folder``, or None when there is none (or it cannot be read as one)."""
    try:
        raw = json.loads((Path(folder) / RECORD_FILE).read_text(encoding="utf-8"))
        return RunRecord(project_name=str(raw["project_name"]), experiment_name=str(raw["experiment_name"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(folder: Path, record: RunRecord) -> Path:
    """Mark ``folder`` (created if needed) as ``record``'s checkpoint folder; returns the record's path."""
    path = Path(folder) / RECORD_FILE
    text = json.dumps({"project_name": record.project_name, "experiment_name": record.experiment_name}, indent=1)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")
    return path
