"""The before/after table of ``make train``: EM on the held-out questions (all, single-hop, two-hop) and searches per
question for the no-search baseline, the SFT warm start and the GRPO policy, read from verl's validation dumps.

Invariant: every figure comes from a dump through :func:`verl_search.eval.report.build_report` (the same numbers
``python -m verl_search.report`` prints); nothing is recomputed from the model.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_search.eval.report import build_report
from verl_search.eval.validation_dump import SourceLookup, read_dump

_RESULT_BLOCK = re.compile(r"<information>|<tool_response>")


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


def stage_result(stage: str, what: str, val_dir: Path, val_data: Path, step: int | None = None) -> StageResult:
    """Summarise the dump of ``step`` (latest when None) in ``val_dir``."""
    found_step, _, rows = read_dump(val_dir, step)
    report = build_report(rows, SourceLookup.from_parquet(val_data))
    data: dict[str, Any] = report["datasets"]
    n = sum(d["n"] for d in data.values())
    # searches the loop executed (result blocks it inserted); the reward's num_searches also counts the tags quoted
    # in the loop's corrective message for an invalid turn
    executed = sum(len(_RESULT_BLOCK.findall(str(r["output"]))) for r in rows) / len(rows)

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
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_table(results: list[StageResult]) -> str:
    """A GitHub-markdown table (also readable as plain text)."""
    header = "| stage | model | EM | EM 1-hop | EM 2-hop | searches/q | gold in results | failed searches | n |"
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.stage} | {r.what} | {_fmt(r.em)} | {_fmt(r.em_single_hop)} | {_fmt(r.em_two_hop)} | "
            f"{r.searches_per_question:.2f} | {r.gold_retrieved:.2f} | {r.failed_searches} | {r.n} |"
        )
    return "\n".join(lines) + "\n"


def as_dicts(results: list[StageResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]


def example_trajectory(val_dir: Path, step: int | None = None) -> str:
    """One validation response of ``step`` (latest when None) that searched, preferring a right answer: the model's
    own text with the retrieved blocks as the loop inserted them."""
    found_step, _, rows = read_dump(val_dir, step)
    searched = [r for r in rows if "<information>" in r["output"] or "<tool_response>" in r["output"]]
    ranked = sorted(searched or rows, key=lambda r: -float(r.get("em", r.get("score", 0.0))))
    row = ranked[0]
    question = str(row.get("input", "")).rsplit("Question:", 1)[-1].split("\n", 1)[0].strip()
    em = float(row.get("em", row.get("score", 0.0)))
    return f"step {found_step}, question: {question}\ngold: {row.get('gts')}  EM: {em:.0f}\n{row['output']}"
