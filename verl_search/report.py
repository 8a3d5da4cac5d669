"""Evaluation report: ``python -m verl_search.report DIR`` turns a verl validation dump into the Search-R1 EM table
and a run folder's per-step metrics into its search-health plots.

Prints (and writes ``DIR/report.md`` and ``DIR/report.json``, atomically) EM per dataset beside the paper's row,
with searches, failures, answer rate, response length and how often a gold answer was retrieved at all. verl's dumps
(``DIR/<global_step>.jsonl``) lack each row's data source: it is found in the validation parquet by the gold answers,
then the question inside ``input``. Invariant: the numbers come only from the dump (and the validation parquet);
every failure to read them raises ``DumpError`` with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from statistics import fmean
from typing import Any

from verl_search.atomic import atomic_path
from verl_search.data.errors import SourceUnavailable
from verl_search.data.pipeline import read_parquet_rows
from verl_search.data.schema import output_data_source
from verl_search.errors import VerlSearchError
from verl_search.eval.plots import plot_health, run_metrics_files
from verl_search.jsonl import read_jsonl
from verl_search.reward import gold_in_text

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


#: (data source, column label, EM of Search-R1 with Qwen2.5-3B-Instruct trained by GRPO, from the paper)
DATASETS = [
    ("searchR1_nq", "NQ", 0.397),
    ("searchR1_triviaqa", "TriviaQA", 0.565),
    ("searchR1_popqa", "PopQA", 0.391),
    ("searchR1_hotpotqa", "HotpotQA", 0.331),
    ("searchR1_2wikimultihopqa", "2Wiki", 0.310),
    ("searchR1_musique", "MuSiQue", 0.124),
    ("searchR1_bamboogle", "Bamboogle", 0.232),
]
PAPER_MODEL = "Search-R1 paper, Qwen2.5-3B-Instruct, GRPO"
#: where the run scripts have verl dump the validation generations, inside a run folder
VALIDATION_DIR = "val_generations"
PAPER_AVERAGE = 0.336
_SEARCH_CALL = re.compile(r"<search>|<tool_call>")
_FAILED = "[search failed"
_INVALID = "[search error"
# what the loops insert: search_r1_agent's <information> blocks, tool_agent's hermes tool responses
_RETRIEVED = re.compile(r"<information>(.*?)</information>|<tool_response>(.*?)</tool_response>", re.S)


def gold_retrieved(row: dict[str, Any]) -> float:
    """1.0 when a gold answer (normalised as EM normalises it) occurs in the text the retriever returned."""
    retrieved = " ".join(a or b for a, b in _RETRIEVED.findall(str(row["output"])))
    return float(gold_in_text([retrieved], golds_of(row.get("gts"))))


def _row_metrics(row: dict[str, Any]) -> dict[str, float]:
    out = row["output"]
    searches = row.get("num_searches")
    answered = row.get("answered")
    return {
        "em": float(row["em"] if "em" in row else row["score"]),
        "searches": float(searches) if searches is not None else float(len(_SEARCH_CALL.findall(out))),
        "failed": float(out.count(_FAILED)),
        "invalid": float(out.count(_INVALID)),
        "answered": float(answered) if answered is not None else float("<answer>" in out),
        "chars": float(len(out)),
        "gold_retrieved": gold_retrieved(row),
        **{k: float(row[k]) for k in ("subem", "f1") if k in row},
    }


def _summary(metrics: list[dict[str, float]]) -> dict[str, float]:
    searches = sum(m["searches"] for m in metrics)
    failed = sum(m["failed"] for m in metrics)
    summary = {
        "n": len(metrics),
        "em": fmean(m["em"] for m in metrics),
        "searches_per_question": searches / len(metrics),
        "failed_searches": int(failed),
        "failed_search_rate": failed / searches if searches else 0.0,
        "invalid_calls": int(sum(m["invalid"] for m in metrics)),
        "answer_rate": fmean(m["answered"] for m in metrics),
        "response_chars": fmean(m["chars"] for m in metrics),
        "gold_retrieved_rate": fmean(m["gold_retrieved"] for m in metrics),
    }
    for key in ("subem", "f1"):
        if all(key in m for m in metrics):
            summary[key] = fmean(m[key] for m in metrics)
    return summary


def build_report(rows: list[dict[str, Any]], lookup: SourceLookup | None) -> dict[str, Any]:
    """Per-dataset summaries, the average over the paper's datasets present, and the paper's row."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for row in rows:
        if "data_source" in row:
            source = output_data_source(str(row["data_source"]))
        elif lookup is not None:
            source = lookup.source_of(row)
        else:
            raise DumpError(
                "the dump rows carry no data_source; pass --data with the validation parquet (data.val_files)"
            )
        groups[source].append(_row_metrics(row))
    unmatched = len(groups.pop(UNMATCHED, []))
    if not groups:
        raise DumpError(
            f"none of the {len(rows)} rows matched a row of the validation data (is --data the right file?)"
        )
    datasets = {s: _summary(m) for s, m in sorted(groups.items())}
    present = [(s, label, paper) for s, label, paper in DATASETS if s in datasets]
    average: dict[str, Any] = {"datasets": [label for _, label, _ in present]}
    if present:
        keys = ("em", "searches_per_question", "failed_search_rate", "answer_rate", "response_chars")
        for key in (*keys, "gold_retrieved_rate"):
            average[key] = fmean(datasets[s][key] for s, _, _ in present)
        average["n"] = sum(datasets[s]["n"] for s, _, _ in present)
        average["paper_em_same_datasets"] = fmean(paper for _, _, paper in present)
    return {
        "num_responses": len(rows),
        "unmatched_rows": unmatched,
        "datasets": datasets,
        "average": average,
        "paper": {"model": PAPER_MODEL, "em": {s: p for s, _, p in DATASETS}, "average": PAPER_AVERAGE},
    }


def _columns(report: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, float | None]]:
    """(label, summary or None when missing, paper EM) per column, the average, then any other data sources."""
    data, avg = report["datasets"], report["average"]
    cols = [(label, data.get(s), paper) for s, label, paper in DATASETS]
    cols.append(
        (f"Avg ({len(avg['datasets'])}/7)", avg if avg["datasets"] else None, avg.get("paper_em_same_datasets"))
    )
    known = {s for s, _, _ in DATASETS}
    return cols + [(s, summary, None) for s, summary in data.items() if s not in known]


_ROWS = [
    ("EM (this run)", lambda s, p: f"{s['em']:.3f}" if s else "-"),
    ("EM (paper)", lambda s, p: f"{p:.3f}" if p is not None else "-"),
    ("responses", lambda s, p: f"{s['n']:d}" if s else "-"),
    ("searches/question", lambda s, p: f"{s['searches_per_question']:.2f}" if s else "-"),
    ("failed searches", lambda s, p: f"{100 * s['failed_search_rate']:.1f}%" if s else "-"),
    ("answer rate", lambda s, p: f"{100 * s['answer_rate']:.1f}%" if s else "-"),
    ("gold in results", lambda s, p: f"{100 * s['gold_retrieved_rate']:.1f}%" if s else "-"),
    ("response chars", lambda s, p: f"{s['response_chars']:.0f}" if s else "-"),
]


def _grid(report: dict[str, Any]) -> list[list[str]]:
    cols = _columns(report)
    header = ["", *(label for label, _, _ in cols)]
    return [header] + [[name, *(fmt(s, p) for _, s, p in cols)] for name, fmt in _ROWS]


def _notes(report: dict[str, Any], step: int, path: Path) -> list[str]:
    avg = report["average"]
    missing = [label for s, label, _ in DATASETS if s not in report["datasets"]]
    notes = [f"Step {step}: {report['num_responses']} responses from {path}.", f"Paper row: {PAPER_MODEL}."]
    if missing:
        notes.append(
            f"Missing datasets ({', '.join(missing)}) show '-'; averages cover the {len(avg['datasets'])} present "
            f"(the paper's 7-dataset average is {PAPER_AVERAGE:.3f})."
        )
    notes.append(
        "Avg: unweighted mean over datasets (responses: their total); failed searches: share of all searches; "
        "gold in results: share of responses whose retrieved text holds a gold answer."
    )
    if report["unmatched_rows"]:
        notes.append(f"{report['unmatched_rows']} rows matched no validation row and are left out.")
    return notes


def render_text(report: dict[str, Any], step: int, path: Path) -> str:
    """An aligned plain-text table plus notes."""
    grid = _grid(report)
    widths = [max(len(row[i]) for row in grid) for i in range(len(grid[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in grid
    ]
    return "\n".join([*lines, "", *_notes(report, step, path)]) + "\n"


def render_markdown(report: dict[str, Any], step: int, path: Path) -> str:
    """The same table as GitHub markdown."""
    grid = _grid(report)
    lines = ["| " + " | ".join(grid[0]) + " |", "|---" + "|---:" * (len(grid[0]) - 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in grid[1:]]
    notes = "\n".join(f"- {n}" for n in _notes(report, step, path))
    return f"# Search-R1 evaluation, step {step}\n\n" + "\n".join(lines) + f"\n\n{notes}\n"


def write_report(val_dir: Path, data: Path | None = None, step: int | None = None) -> tuple[dict[str, Any], int, Path]:
    """Write ``report.json`` and ``report.md`` of ``step``'s dump (default: the latest); ``(report, step, dump)``."""
    found, path, rows = read_dump(val_dir, step)
    report = build_report(rows, SourceLookup.from_parquet(data) if data else None)
    report.update(step=found, dump=str(path))
    for name, text in (
        ("report.json", json.dumps(report, indent=2) + "\n"),
        ("report.md", render_markdown(report, found, path)),
    ):
        with atomic_path(Path(val_dir) / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return report, found, path


def main(argv: list[str] | None = None) -> int:
    """CLI entry; exits 1 with one line on stderr when the dump cannot be read."""
    p = argparse.ArgumentParser(prog="python -m verl_search.report", description=__doc__.splitlines()[0])
    p.add_argument(
        "dir",
        type=Path,
        help="a run folder (RUN_DIR of the run scripts: its metrics and validation dumps), or the validation dump "
        "folder itself (trainer.validation_data_dir)",
    )
    p.add_argument("--step", type=int, default=None, help="which step's dump (default: the latest)")
    p.add_argument("--data", type=Path, default=None, help="validation parquet, to recover each row's data source")
    p.add_argument(
        "--metrics",
        type=Path,
        default=None,
        help="the run's verl file-logger metrics (JSONL): also draw its per-step search health into DIR/health/ "
        "(default for a run folder: its metrics.jsonl and those of its earlier launches)",
    )
    args = p.parse_args(argv)
    run_dir = args.dir if any((args.dir / n).exists() for n in ("metrics.jsonl", "metrics", VALIDATION_DIR)) else None
    metrics = [args.metrics] if args.metrics is not None else (run_metrics_files(run_dir) if run_dir else [])
    dumps = run_dir / VALIDATION_DIR if run_dir else args.dir
    try:
        if args.metrics is not None and not args.metrics.is_file():
            raise DumpError(f"no metrics file at {args.metrics}")
        has_dumps = dumps.is_dir() and any(dumps.glob("*.jsonl"))
        if run_dir and not metrics and not has_dumps:
            raise DumpError(f"{run_dir} holds neither metrics nor validation dumps yet")
        if not run_dir or has_dumps:
            report, step, path = write_report(dumps, args.data, args.step)
            print(render_text(report, step, path), end="")
            print(f"wrote {dumps / 'report.md'} and {dumps / 'report.json'}")
        else:
            print(f"no validation dumps in {dumps} yet (trainer.test_freq): the search-health plots only")
    except (DumpError, OSError) as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 1
    if metrics:
        out = (run_dir or args.dir) / "health"
        names = ", ".join(m.name for m in metrics)
        written = plot_health(metrics, out, title=f"search health per step: {names}")
        print(f"wrote {len(written)} search-health plots under {out} (from {len(metrics)} metrics file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
