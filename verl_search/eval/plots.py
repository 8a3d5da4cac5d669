"""Plots of a run's per-step metrics from verl's file logger: its search health (``plot_health``), or any panels, as
PNG files. Invariant: every plotted number is read from the metrics file as logged; a panel whose metrics are absent
says so; every PNG is written atomically.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_search.atomic import atomic_path
from verl_search.jsonl import read_jsonl


@dataclass(frozen=True)
class Panel:
    """One plot: the metric keys (regular expressions) it draws, each as its own line."""

    title: str
    ylabel: str
    patterns: tuple[str, ...]
    filename: str


HEALTH_PANELS = (
    Panel(
        "Searches per trajectory",
        "searches / share",
        (r"^search/calls_per_traj/mean$", r"^search/calls_per_traj/share_0$", r"^search/calls_per_traj/max$"),
        "health_searches.png",
    ),
    Panel(
        "Answers and retrieval",
        "share of trajectories",
        (r"^search/answered_share$", r"^search/gold_in_results_share$", r"^search/invalid_action_share$"),
        "health_answers.png",
    ),
    Panel(
        "Failed searches",
        "share of calls / count",
        (r"^search/failed_share$", r"^search/failed/(.+)$", r"^search/alarm_steps$"),
        "health_failures.png",
    ),
    Panel(
        "Search latency, waiting and lengths",
        "seconds / share",
        (
            r"^search/latency_s/(p50|p99)$",
            r"^search/wait_share$",
            r"^response_length/clip_ratio$",
            r"^search/results_cut_share$",
        ),
        "health_latency.png",
    ),
)


def read_metrics(*paths: Path) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` from verl file-logger JSONL files read in order (a later line for a step wins)."""
    steps: dict[int, dict[str, float]] = {}
    for path in paths:
        for _, row in read_jsonl(path, ValueError):
            data = {k: float(v) for k, v in row.get("data", {}).items() if isinstance(v, int | float)}
            steps.setdefault(int(row["step"]), {}).update(data)
    return steps


def run_metrics_files(run_dir: Path) -> list[Path]:
    """A run folder's per-step metrics, oldest launch first: ``metrics/*.jsonl``, then ``metrics.jsonl``."""
    run_dir = Path(run_dir)
    earlier = sorted((run_dir / "metrics").glob("*.jsonl")) if (run_dir / "metrics").is_dir() else []
    current = run_dir / "metrics.jsonl"
    return [*earlier, *([current] if current.is_file() else [])]


def series(steps: dict[int, dict[str, float]], pattern: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric matching ``pattern``, as ``{label: [(step, value), ...]}``."""
    regex = re.compile(pattern)
    out: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(steps):
        for key, value in steps[step].items():
            match = regex.match(key)
            if match:
                is_val = match.groups() and key.startswith("val-")
                label = f"validation {match.group(1)}" if is_val else f"training ({key})"
                out.setdefault(label, []).append((step, value))
    return out


def plot_health(metrics: Path | Sequence[Path], out_dir: Path, title: str = "") -> list[Path]:
    """The run's search health per training step (``HEALTH_PANELS``), plus ``search_health.png`` with all four."""
    return plot_panels(metrics, out_dir, HEALTH_PANELS, "search_health.png", title)


def _draw(ax, steps: dict[int, dict[str, float]], panel: Panel) -> None:
    drawn = False
    for pattern in panel.patterns:
        for label, points in series(steps, pattern).items():
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, markersize=3, label=label)
            drawn = True
    ax.set_title(panel.title)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` as PNG, atomically (its folder is created)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return path


def plot_panels(
    metrics: Path | Sequence[Path], out_dir: Path, panels: Sequence[Panel], overview: str, title: str = ""
) -> list[Path]:
    """One PNG per panel (four at most) plus ``overview`` with all of them; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_metrics(*([metrics] if isinstance(metrics, str | Path) else metrics))
    written = []
    for panel in panels:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        _draw(ax, steps, panel)
        written.append(save_png(fig, Path(out_dir) / panel.filename))
        plt.close(fig)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw(ax, steps, panel)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    written.append(save_png(fig, Path(out_dir) / overview))
    plt.close(fig)
    return written
