"""Reading JSON-lines files: ``(line number, value)`` for each non-blank line, in file order, as they are read.

Invariant: a line that is not JSON raises the caller's error type naming the file and the line; what a value must
hold is the caller's to say.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: Path, error: type[Exception]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of ``path`` (from 1); a line that is not JSON raises
    ``error``."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{number}: not valid JSON ({e.msg})") from e
            yield number, value
