"""``python -m cpu_bench.train.seeds RUN [RUN ...]``: several ``make train`` runs (one per seed) as one result: the
table of EM after SFT and after GRPO with each run's gain and standard error, their mean and spread, and the training
curves as the mean over the runs with a band from the lowest to the highest run at each step.

    for s in 0 1 2 3 4; do make train TRAIN_ARGS="--seed $s --out runs/seed$s"; done
    python -m cpu_bench.train.seeds runs/seed0 runs/seed1 runs/seed2 runs/seed3 runs/seed4 --out runs/seeds

Invariant: every figure is read from the runs' own ``summary.json`` and ``grpo/metrics.jsonl``; a run without them is
named in a one-line error, never skipped silently.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.errors import VerlSearchError


class SeedRunError(VerlSearchError, ValueError):
    """A run folder lacks what ``make train`` writes (summary.json, grpo/metrics.jsonl)."""


@dataclass(frozen=True)
class SeedRun:
    name: str
    em_sft: float
    em_grpo: float
    gain: float
    stderr: float
    metrics: Path


def read_run(folder: Path) -> SeedRun:
    summary_path = folder / "summary.json"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        by_stage = {row["stage"]: row for row in summary["results"]}
        gain = summary["grpo_gain"]
        run = SeedRun(folder.name, float(by_stage["after SFT"]["em"]), float(by_stage["after GRPO"]["em"]),
                      float(gain["gain"]), float(gain["stderr"]), folder / "grpo" / "metrics.jsonl")  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SeedRunError(f"{folder}: not a finished make train run ({type(e).__name__}: {e})") from e
    if not run.metrics.is_file():
        raise SeedRunError(f"{folder}: no GRPO metrics at {run.metrics}")
    return run


def table(runs: Sequence[SeedRun], target: float) -> str:
    """Markdown: one row per run, then the mean and spread; ``target`` is the gain every run should reach."""
    lines = ["| run | EM after SFT | EM after GRPO | gain ± s.e. (paired) | gain / s.e. |", "|---|---:|---:|---:|---:|"]
    for r in runs:
        ratio = r.gain / r.stderr if r.stderr > 0 else math.inf
        lines.append(f"| {r.name} | {r.em_sft:.2f} | {r.em_grpo:.2f} | {r.gain:+.2f} ± {r.stderr:.2f} | {ratio:.1f} |")
    gains = [r.gain for r in runs]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    lines.append(
        f"| mean of {len(runs)} | {statistics.mean(r.em_sft for r in runs):.2f} | "
        f"{statistics.mean(r.em_grpo for r in runs):.2f} | {statistics.mean(gains):+.2f} (s.d. {spread:.2f}, "
        f"{min(gains):+.2f} … {max(gains):+.2f}) | |"
    )
    met = sum(g >= target for g in gains)
    lines.append(f"\nGain ≥ {target:+.2f} in {met} of {len(runs)} runs.")
    return "\n".join(lines) + "\n"


#: the panels of the band plot: (title, y label, metric keys as a regular expression: a run's value at a step is the
#: mean of its matching keys, e.g. the held-out reward over the validation data sources)
BAND_PANELS = (
    ("sampled reward (EM) per step", "EM", r"^critic/score/mean$"),
    ("held-out EM at validation", "EM", r"^val-core/.+/reward/mean@1$"),
    ("searches per trajectory per step", "searches", r"^search/calls_per_traj/mean$"),
    ("gold answer in the results per step", "share of trajectories", r"^search/gold_in_results_share$"),
)


def run_series(metrics: dict[int, dict[str, float]], pattern: str) -> dict[int, float]:
    """``{step: value}``: the mean of the keys matching ``pattern`` at each step that logged any."""
    regex = re.compile(pattern)
    out = {}
    for step, row in metrics.items():
        values = [v for k, v in row.items() if regex.match(k)]
        if values:
            out[step] = statistics.mean(values)
    return out


def plot_band(runs: Sequence[SeedRun], out: Path, title: str = "") -> Path:
    """``training_curves_seeds.png``: each panel's metric, mean over the runs per step, with the band between the
    lowest and the highest run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from verl_search.eval.plots import read_metrics, save_png

    per_run = [read_metrics(r.metrics) for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (label, ylabel, pattern) in zip(axes.flat, BAND_PANELS, strict=True):
        series = [run_series(m, pattern) for m in per_run]
        steps = sorted({s for one in series for s in one})
        values = [[one[s] for one in series if s in one] for s in steps]
        if steps:
            ax.plot(steps, [statistics.mean(v) for v in values], marker="o", markersize=3,
                    label=f"mean of {len(runs)} runs")  # fmt: skip
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.25,
                            label="lowest … highest run")  # fmt: skip
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"GRPO over {len(runs)} runs ({', '.join(r.name for r in runs)})", fontsize=10)
    fig.tight_layout()
    path = save_png(fig, Path(out) / "training_curves_seeds.png")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cpu_bench.train.seeds", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="make train output folders (--out), one per seed")
    p.add_argument("--out", type=Path, default=None, help="where to write seeds.md and the plot (default: no files)")
    p.add_argument("--target", type=float, default=0.10, help="the gain every run should reach (default +0.10)")
    args = p.parse_args(argv)
    try:
        runs = [read_run(folder) for folder in args.runs]
    except SeedRunError as e:
        print(f"seeds: error: {e}", file=sys.stderr)
        return 1
    text = table(runs, args.target)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.out / "seeds.md") as tmp:
            tmp.write_text(text, encoding="utf-8")
        print(f"wrote {args.out / 'seeds.md'} and {plot_band(runs, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
