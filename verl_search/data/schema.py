"""Input validation: raw rows (Search-R1 parquet or FlashRAG jsonl) -> QARecord, or an error naming file/row/column;
and rows already in verl's row format (verl ≤0.5's, SkyRL's, ours) -> the raw fields.

Invariant: every QARecord has a non-empty question, at least one non-empty gold answer and a data source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_search.data.errors import InputSchemaError

REQUIRED_PARQUET_COLUMNS = ("question", "golden_answers", "data_source")
REQUIRED_JSONL_KEYS = ("question", "golden_answers")
SOURCE_PREFIX = "searchR1_"
DEFAULT_ABILITY = "fact-reasoning"
#: the columns that mark a file as already in verl's row format
PROMPT_COLUMN = "prompt"
REWARD_COLUMNS = ("reward_model", "reward_spec")
#: where the prompt templates of Search-R1, verl and SkyRL put the question: after the last such marker
_QUESTION_MARKERS = ("Question:", "question:")


@dataclass(frozen=True)
class QARecord:
    """One validated question with its gold answers, before any prompt is applied."""

    id: str
    question: str
    answers: tuple[str, ...]
    data_source: str
    ability: str


def check_columns(columns: Iterable[str], required: Iterable[str], where: str) -> None:
    """Raise InputSchemaError naming every required column missing from ``columns``."""
    present = set(columns)
    missing = [c for c in required if c not in present]
    if missing:
        raise InputSchemaError(f"{where}: missing column(s) {', '.join(missing)} (found: {sorted(present)})")


def output_data_source(source: str) -> str:
    """``nq`` -> ``searchR1_nq`` (the names verl's default reward routes); already prefixed names are kept."""
    return source if source.startswith(SOURCE_PREFIX) else SOURCE_PREFIX + source


def _missing(value: Any) -> bool:
    """None, or the NaN pandas puts in a string column for a null."""
    return value is None or (isinstance(value, float) and value != value)


def parse_answers(value: Any, where: str) -> tuple[str, ...]:
    """Gold answers as a tuple of non-empty strings; accepts a list, tuple, numpy array or a single string."""
    if _missing(value):
        raise InputSchemaError(f"{where}: column golden_answers is missing")
    if isinstance(value, str):
        items: list[Any] = [value]
    elif hasattr(value, "tolist") and not isinstance(value, Mapping):
        items = value.tolist()
        items = items if isinstance(items, list) else [items]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise InputSchemaError(f"{where}: column golden_answers must be a list of strings, got {type(value).__name__}")
    answers = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise InputSchemaError(f"{where}: column golden_answers must hold strings, got {type(item).__name__}")
        text = str(item).strip()
        if text:
            answers.append(text)
    if not answers:
        raise InputSchemaError(f"{where}: column golden_answers is empty")
    return tuple(answers)


def _text(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        if _missing(value):
            raise InputSchemaError(f"{where}: column {key} is missing")
        raise InputSchemaError(f"{where}: column {key} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputSchemaError(f"{where}: column {key} is empty")
    return value.strip()


def parse_record(raw: Mapping[str, Any], where: str, default_id: str, default_source: str | None = None) -> QARecord:
    """Validate one raw row. ``where`` names it in errors (file and row); ``default_source`` fills a missing source."""
    question = _text(raw, "question", where)
    answers = parse_answers(raw.get("golden_answers"), where)
    if _missing(raw.get("data_source")) and default_source is not None:
        source = default_source
    else:
        source = _text(raw, "data_source", where)
    raw_id = raw.get("id")
    ability = raw.get("ability")
    return QARecord(
        id=default_id if _missing(raw_id) else str(raw_id),
        question=question,
        answers=answers,
        data_source=output_data_source(source),
        ability=ability if isinstance(ability, str) and ability else DEFAULT_ABILITY,
    )


def is_processed(columns: Iterable[str]) -> bool:
    """Whether a parquet file's columns are verl's row format rather than Search-R1's raw one."""
    present = set(columns)
    has_reward = any(c in present for c in REWARD_COLUMNS)
    return PROMPT_COLUMN in present and has_reward and not present & {"question", "golden_answers"}


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _nonblank(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _question_from_prompt(prompt: Any) -> str | None:
    messages = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if not isinstance(messages, list):
        return None
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    content = _nonblank(users[-1].get("content")) if users else None
    if content is None:
        return None
    cuts = [content.rfind(m) + len(m) for m in _QUESTION_MARKERS if m in content]
    return _nonblank(content[max(cuts) :]) if cuts else None


def recover_row(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The raw fields (question, golden_answers, data_source, id, ability) of one processed row."""
    extra = raw.get("extra_info")
    create = _get(extra, "tools_kwargs", "search", "create_kwargs")
    question = (
        _nonblank(_get(extra, "question"))
        or _nonblank(_get(create, "question"))
        or _question_from_prompt(raw.get("prompt"))
    )
    if question is None:
        raise InputSchemaError(
            f"{where}: no question in extra_info.question, extra_info.tools_kwargs.search.create_kwargs.question "
            "or the prompt's user message (after 'Question:')"
        )
    places = [*(raw.get(column) for column in REWARD_COLUMNS), create]
    answers = next((a for place in places if (a := _get(place, "ground_truth", "target")) is not None), None)
    if answers is None:
        raise InputSchemaError(f"{where}: no gold answers in reward_model/reward_spec.ground_truth.target")
    return {
        "question": question,
        "golden_answers": answers,
        "data_source": raw.get("data_source"),
        "id": _get(extra, "id"),
        "ability": raw.get("ability"),
    }
