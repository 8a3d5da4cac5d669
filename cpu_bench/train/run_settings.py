"""The settings a ``make train`` run folder was built with (``settings.json``), checked before any stage runs.

Invariant: finished stages are reused from a run folder only under the settings that built them. A rerun whose
settings differ is refused with the keys that differ, except GRPO settings when no GRPO run is in the folder (how
``make demo`` and a GRPO-only rerun work: the GRPO stage is deleted, the warm start kept).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cpu_bench.train.config import TrainConfig
from verl_search.atomic import atomic_path
from verl_search.errors import VerlSearchError

FILE = "settings.json"
#: where a run happens, not what it computes
_NOT_SETTINGS = {"out_dir", "retriever_url", "search_backend", "web_cache"}


class SettingsMismatch(VerlSearchError, ValueError):
    """The run folder was built with other settings; the message names them and the way out."""


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flat(value, name + ".") if isinstance(value, dict) else {name: value})
    return flat


def settings_of(config: TrainConfig) -> dict[str, Any]:
    flat = _flat(config.model_dump(mode="json", exclude=_NOT_SETTINGS))
    if flat["world.kind"] == "toy":  # the default world adds no key: folders built before the option stay reusable
        del flat["world.kind"]
    return flat


def check_and_record(config: TrainConfig, out: Path, redo_grpo: bool = False) -> None:
    """Raise SettingsMismatch when ``out`` holds stages built with other settings; otherwise record these.
    ``redo_grpo``: the caller deletes the GRPO stage next, so GRPO settings may change."""
    path, now = out / FILE, settings_of(config)
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SettingsMismatch(
                f"{path} is unreadable ({e}); delete it only if the folder's stages are stale"
            ) from e
        changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        reusable = all(k.startswith("grpo.") for k in changed) and (redo_grpo or not (out / "grpo").exists())
        if changed and not reusable:
            detail = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed)
            raise SettingsMismatch(
                f"{out} holds stages built with other settings ({detail}); use another --out, or delete the folder "
                "(or only its grpo/ folder, for a change of GRPO settings)"
            )
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(now, indent=2, sort_keys=True), encoding="utf-8")
