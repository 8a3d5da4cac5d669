"""The record ``build_index.py`` writes beside every index it builds (``<index>.build.json``): what the index is, what
it was built from, and its recall against the flat index it approximates, measured at each search-time value tried.

Invariant: a record is written only after its index, atomically; the server reads it to report the index's type,
memory and recall, and never needs it to serve (a missing or unreadable record is ``None``, with a warning).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

FORMAT = 1
#: the faiss parameter each family of index is searched with (faiss.ParameterSpace's names)
SEARCH_PARAMS = ("nprobe", "efSearch")


@dataclass(frozen=True)
class RecallPoint:
    """Recall@k (k as a string key: JSON's) at one value of the search-time parameter (None: the index has none)."""

    value: int | None
    recall: dict[str, float]


@dataclass(frozen=True)
class BuildRecord:
    """One built index: ``factory`` is the faiss factory string; ``search_param`` (``nprobe``, ``efSearch`` or None)
    is stored in the index file at ``search_value``; ``curve`` holds recall against flat at each value measured."""

    index_type: str
    factory: str
    rows: int
    dim: int
    bytes: int
    source: str
    train_rows: int
    search_param: str | None
    search_value: int | None
    recall_queries: int
    query_source: str
    curve: list[RecallPoint] = field(default_factory=list)
    faiss_version: str = ""
    format: int = FORMAT

    def recall_at(self, value: int | None, k: int) -> float | None:
        """Stored recall@``k`` at ``value`` of the search parameter (None: not measured there, or not at this k)."""
        for point in self.curve:
            if point.value == value:
                return point.recall.get(str(k))
        return None

    def measured_ks(self) -> list[int]:
        return sorted({int(k) for point in self.curve for k in point.recall})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> BuildRecord:
        fields = dict(data)
        fields["curve"] = [RecallPoint(p["value"], {str(k): float(v) for k, v in p["recall"].items()})
                           for p in data.get("curve", [])]  # fmt: skip
        return cls(**fields)


def record_path(index_path: Path) -> Path:
    """Where the record of ``index_path`` lives: beside it, its name plus ``.build.json``."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + ".build.json")


def write_record(index_path: Path, record: BuildRecord) -> Path:
    path = record_path(index_path)
    with atomic_path(path) as tmp:
        tmp.write_text(record.to_json())
    return path


def read_record(index_path: Path) -> BuildRecord | None:
    """The record beside ``index_path``; None when there is none, or (logged) when it cannot be read."""
    path = record_path(index_path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this server reads {FORMAT}")
        return BuildRecord.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.warning("ignoring %s: not a build record this server reads (%s)", path.name, e)
        return None
