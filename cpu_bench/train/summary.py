"""The before/after table of ``make train``: EM on the held-out questions (all, single-hop, two-hop) and searches per
question for the no-search baseline, the SFT warm start and the GRPO policy, read from verl's validation dumps.

Invariant: every figure comes from a dump through :func:`verl_search.report.build_report` (the same numbers
``python -m verl_search.report`` prints); nothing is recomputed from the model.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_search.report import SourceLookup, build_report, gold_retrieved, read_dump
from verl_search.reward import gold_answers

_RESULT_BLOCK = re.compile(r"<information>|<tool_response>")
#: what the access tool returns: a window of a page (``[page 1 of 3] Title``) or its labelled failure
_ACCESS_REPLY = re.compile(r"<tool_response>\s*\[(?:page \d+ of \d+\]|access (?:failed|error))")
_PAGE_WINDOW = re.compile(r"<tool_response>\s*\[page \d+ of \d+\] ([^\n]*)")


@dataclass(frozen=True)
class StageResult:
    """One row of the table."""

    stage: str
    what: str
    step: int
    n: int
    em: float
    em_single_hop: float | None
    em_two_hop: float | None
    searches_per_question: float
    answer_rate: float
    failed_searches: int
    gold_retrieved: float = 0.0
    pages_per_question: float = 0.0  # distinct pages the access tool showed (the pages world)


def stage_result(stage: str, what: str, val_dir: Path, val_data: Path, step: int | None = None) -> StageResult:
    """Summarise the dump of ``step`` (latest when None) in ``val_dir``."""
    found_step, _, rows = read_dump(val_dir, step)
    report = build_report(rows, SourceLookup.from_parquet(val_data))
    data: dict[str, Any] = report["datasets"]
    n = sum(d["n"] for d in data.values())
    # searches the loop executed (result blocks it inserted); the reward's num_searches also counts the tags quoted
    # in the loop's corrective message for an invalid turn
    outputs = [str(r["output"]) for r in rows]
    results = sum(len(_RESULT_BLOCK.findall(o)) for o in outputs)
    executed = (results - sum(len(_ACCESS_REPLY.findall(o)) for o in outputs)) / len(rows)
    pages = sum(len(set(_PAGE_WINDOW.findall(o))) for o in outputs) / len(rows)

    def weighted(key: str) -> float:
        return sum(d[key] * d["n"] for d in data.values()) / n

    def hop(source: str) -> float | None:
        return data[source]["em"] if source in data else None

    return StageResult(
        stage=stage,
        what=what,
        step=found_step,
        n=n,
        em=weighted("em"),
        em_single_hop=hop("searchR1_toy_1hop"),
        em_two_hop=hop("searchR1_toy_2hop"),
        searches_per_question=executed,
        answer_rate=weighted("answer_rate"),
        failed_searches=int(sum(d["failed_searches"] for d in data.values())),
        gold_retrieved=weighted("gold_retrieved_rate"),
        pages_per_question=pages,
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def em_stderr(r: StageResult) -> float:
    """The standard error of an EM over ``n`` questions (a binomial share)."""
    return math.sqrt(r.em * (1 - r.em) / r.n) if r.n else 0.0


def render_table(results: list[StageResult], gain: Gain | None = None) -> str:
    """A GitHub-markdown table (also readable as plain text), with the EM's standard error, and GRPO's gain below."""
    columns = ["stage", "model", "EM", "± s.e.", "EM 1-hop", "EM 2-hop", "searches/q", "gold in results"]
    pages = any(r.pages_per_question for r in results)  # a column only where a page was opened
    columns += ["failed searches", *(["pages opened/q"] if pages else []), "n"]
    header = "| " + " | ".join(columns) + " |"
    lines = [header, "|---|---|" + "---:|" * (len(columns) - 2)]
    for r in results:
        opened = f"{r.pages_per_question:.2f} | " if pages else ""
        lines.append(
            f"| {r.stage} | {r.what} | {_fmt(r.em)} | {em_stderr(r):.3f} | {_fmt(r.em_single_hop)} | "
            f"{_fmt(r.em_two_hop)} | {r.searches_per_question:.2f} | {r.gold_retrieved:.2f} | {r.failed_searches} | "
            f"{opened}{r.n} |"
        )
    if gain is not None:
        lines += ["", gain.describe()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Gain:
    """EM after GRPO minus EM after SFT on the same questions, with the standard error of the paired difference."""

    gain: float
    stderr: float
    n: int

    def describe(self) -> str:
        ratio = f"{self.gain / self.stderr:+.1f}" if self.stderr > 0 else "no variation, so no"
        return (
            f"GRPO gain: {self.gain:+.3f} EM, standard error {self.stderr:.3f} (paired over the same {self.n} "
            f"questions): {ratio} standard errors"
        )


def paired_gain(val_dir: Path, before_step: int = 0, after_step: int | None = None) -> Gain:
    """The gain from the dump of ``before_step`` to that of ``after_step`` (latest when None), question by question
    (rows matched by their prompt; a question in only one dump is left out)."""
    _, _, before = read_dump(val_dir, before_step)
    _, _, after = read_dump(val_dir, after_step)

    def by_prompt(rows: list[dict[str, Any]]) -> dict[str, float]:
        return {str(r.get("input", "")): _em(r) for r in rows}

    first, last = by_prompt(before), by_prompt(after)
    diffs = [last[q] - first[q] for q in first.keys() & last.keys()]
    n = len(diffs)
    if n < 2:
        return Gain(sum(diffs) / n if n else 0.0, 0.0, n)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return Gain(mean, math.sqrt(variance / n), n)


def as_dicts(results: list[StageResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]


_QUERY = re.compile(r"<search>(.*?)</search>|\"query_list\"\s*:\s*\[\s*\"([^\"]*)\"", re.S)
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
_QUESTION_WORDS = {"In", "Who", "What", "Which", "Where", "When", "How"}


def _em(row: dict[str, Any]) -> float:
    return float(row.get("em", row.get("score", 0.0)))


def _question(row: dict[str, Any]) -> str:
    return str(row.get("input", "")).rsplit("Question:", 1)[-1].split("\n", 1)[0].strip()


def _showcase_key(row: dict[str, Any]) -> tuple[float, bool, bool, bool]:
    """What makes a trajectory show the skill, most important first: a right answer, read from the retrieved text
    (the report's gold-in-results test), after a first query that names the question's entity, after searching."""
    output = row["output"]
    queries = [a or b for a, b in _QUERY.findall(output)]
    names = [n for n in _NAME.findall(_question(row)) if n.split()[0] not in _QUESTION_WORDS]
    named = bool(queries) and any(n.lower() in queries[0].lower() for n in names)
    return _em(row), bool(gold_retrieved(row)), named, bool(_RESULT_BLOCK.search(output))


def _gold_text(gts: Any) -> str:
    """The gold answers as a reader wants them: ``A`` or ``A / B`` (verl dumps ``{"target": [...]}``); a value the
    reward could not read is shown as it is."""
    try:
        return " / ".join(gold_answers(gts))
    except ValueError:
        return str(gts)


def example_trajectory(val_dir: Path, step: int | None = None) -> str:
    """The validation response of ``step`` (latest when None) that best shows the skill (:func:`_showcase_key`): the
    model's own text with the retrieved blocks as the loop inserted them, and a note when none searched and answered
    from what it read."""
    found_step, _, rows = read_dump(val_dir, step)
    row = max(rows, key=_showcase_key)
    em, read, _, searched = _showcase_key(row)
    note = ""
    if not searched:
        note = "\n(the model searched on none of the held-out questions: this answer is from memory)"
    elif not (em and read):
        note = "\n(no held-out answer was both right and read from the retrieved text)"
    head = f"step {found_step}, question: {_question(row)}\ngold: {_gold_text(row.get('gts'))}  EM: {em:.0f}{note}"
    return f"{head}\n{row['output']}"
