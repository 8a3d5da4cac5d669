"""A live console line per GRPO step while verl trains in a child process: the new rows of verl's file-logger JSONL
(``VERL_FILE_LOGGER_PATH``), read as they appear.

Invariant: only complete lines are read (verl may be writing the next one); each step is reported once; a file that
does not exist yet, or a line that is not a metrics row, is skipped without error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: what the line shows: (metric key, label, format)
SHOWN = (
    ("critic/score/mean", "reward", "{:.3f}"),
    ("search/calls_per_traj/mean", "searches/trajectory", "{:.2f}"),
    ("search/answered_share", "answered", "{:.2f}"),
    ("timing_s/step", "s/step", "{:.0f}"),
)
#: the validation reward verl logs per data source before training and every test_freq steps (their mean is shown)
VALIDATION_PREFIX = "val-core/"


def describe(step: int, data: dict[str, Any], total_steps: int | None) -> str:
    """One line for a step's metrics row, e.g. ``step 2/6: reward 0.412, searches/trajectory 1.31, ...``."""
    where = f"step {step}/{total_steps}" if total_steps else f"step {step}"
    parts = [f"{label} {fmt.format(data[key])}" for key, label, fmt in SHOWN if isinstance(data.get(key), int | float)]
    validation = [float(v) for k, v in data.items() if k.startswith(VALIDATION_PREFIX) and "/reward/mean" in k]
    if validation:
        sources = f" (mean of {len(validation)} data sources)" if len(validation) > 1 else ""
        parts.append(f"validation reward {sum(validation) / len(validation):.3f}{sources}")
    return f"{where}: " + (", ".join(parts) if parts else "no metrics yet")


class MetricsTail:
    """Reads the rows appended to ``path`` since the last :meth:`poll` and logs one line per step."""

    def __init__(self, path: Path, name: str, total_steps: int | None = None) -> None:
        self.path = Path(path)
        self.name = name
        self.total_steps = total_steps
        self._offset = 0

    def lines(self) -> list[str]:
        """The lines describing the complete rows written since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        out = []
        for raw in complete.splitlines():
            try:
                row = json.loads(raw)
                out.append(describe(int(row["step"]), dict(row["data"]), self.total_steps))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def poll(self) -> None:
        for line in self.lines():
            logger.info("%s: %s", self.name, line)
