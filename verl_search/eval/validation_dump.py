"""Read the generations verl dumps in validation (``DIR/<global_step>.jsonl``: ``input``, ``output``, ``gts``,
``score`` and the reward's extra keys) and find each row's data source, which verl does not dump: from the validation
parquet, by the gold answers, then the question inside ``input``.
Invariant: every failure raises ``DumpError`` with a one-line message.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verl_search.data.errors import SourceUnavailable
from verl_search.data.schema import output_data_source
from verl_search.data.sources import read_parquet_rows
from verl_search.errors import VerlSearchError
from verl_search.jsonl import read_jsonl

_STEP_FILE = re.compile(r"^(\d+)\.jsonl$")
#: the data source of a row no validation row (or more than one) matches
UNMATCHED = "unmatched"


class DumpError(VerlSearchError, ValueError):
    """The dump folder or the validation data cannot be used; the message says why."""


def dump_steps(folder: Path) -> dict[int, Path]:
    """``{step: path}`` of every ``<step>.jsonl`` in ``folder``."""
    if not folder.is_dir():
        raise DumpError(f"{folder} is not a folder (pass trainer.validation_data_dir)")
    steps = {int(m.group(1)): p for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)) and p.is_file()}
    if not steps:
        raise DumpError(f"{folder} holds no validation dumps (<step>.jsonl); set trainer.validation_data_dir to it")
    return dict(sorted(steps.items()))


def read_dump(folder: Path, step: int | None = None) -> tuple[int, Path, list[dict[str, Any]]]:
    """The step, file and rows of one dump: the latest step unless ``step`` is given."""
    steps = dump_steps(folder)
    if step is None:
        step = max(steps)
    if step not in steps:
        raise DumpError(f"no dump for step {step} in {folder}; steps found: {', '.join(map(str, steps))}")
    path = steps[step]
    rows = []
    for number, row in read_jsonl(path, DumpError):
        if not isinstance(row, dict) or not isinstance(row.get("output"), str):
            raise DumpError(f"{path}:{number}: not a verl generation row (no string 'output')")
        if "em" not in row and "score" not in row:
            raise DumpError(f"{path}:{number}: the row has neither 'em' nor 'score'")
        rows.append(row)
    if not rows:
        raise DumpError(f"{path} is empty")
    return step, path, rows


def golds_of(value: Any) -> tuple[str, ...]:
    """The gold answers of a dumped ``gts`` or a parquet column, sorted (``()`` when there are none)."""
    if isinstance(value, dict):
        value = value.get("target", value.get("ground_truth"))
    if isinstance(value, str):
        return (value,)
    if value is None or not isinstance(value, Iterable):
        return ()
    return tuple(sorted(str(v) for v in value))


class SourceLookup:
    """Find a dumped row's data source from the validation rows it was generated from."""

    def __init__(self, rows: Iterable[tuple[str, str, tuple[str, ...]]]) -> None:
        self._by_golds: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)
        for source, question, golds in rows:
            self._by_golds[golds].append((question, output_data_source(source)))

    @classmethod
    def from_parquet(cls, path: Path) -> SourceLookup:
        """Read a Search-R1 parquet, raw (``question``, ``golden_answers``) or preprocessed (``extra_info``)."""
        try:
            columns, rows = read_parquet_rows(Path(path))
        except SourceUnavailable as e:
            raise DumpError(f"cannot read validation data: {e}") from e
        if "data_source" not in columns:
            raise DumpError(f"{path} has no data_source column")
        entries = []
        for row in rows:
            question = row.get("question")
            if question is None and isinstance(row.get("extra_info"), dict):
                question = row["extra_info"].get("question")
            golds = golds_of(row.get("golden_answers"))
            if not golds and isinstance(row.get("reward_model"), dict):
                golds = golds_of(row["reward_model"].get("ground_truth"))
            if question is None or not golds:
                raise DumpError(f"{path}: rows need a question and gold answers (Search-R1 format)")
            entries.append((str(row["data_source"]), str(question).strip(), golds))
        return cls(entries)

    def source_of(self, row: dict[str, Any]) -> str:
        """The data source of a dumped row, or ``UNMATCHED`` when no validation row (or more than one) matches it."""
        candidates = self._by_golds.get(golds_of(row.get("gts")), [])
        sources = {s for _, s in candidates}
        if len(sources) > 1:
            text = str(row.get("input", ""))
            sources = {s for q, s in candidates if q and q.rstrip("?") in text}
        return next(iter(sources)) if len(sources) == 1 else UNMATCHED
