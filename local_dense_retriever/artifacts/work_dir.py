"""The work folder of a resumable build: what it holds is reused only while its fingerprint (the build's inputs)
is unchanged; otherwise it is emptied before the build starts again."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)


def claim_work_dir(folder: Path, fingerprint: dict, belongs: str) -> Path:
    """``folder`` made ready for a build of ``fingerprint``: kept when its ``meta.json`` matches, else discarded
    (logged: the parts belong to another ``belongs``); the fingerprint is then written. Returns ``folder``."""
    meta = folder / "meta.json"
    if folder.exists() and (not meta.is_file() or json.loads(meta.read_text()) != fingerprint):
        logger.warning("discarding %s: it belongs to another %s", folder, belongs)
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(meta) as tmp:
        tmp.write_text(json.dumps(fingerprint))
    return folder
