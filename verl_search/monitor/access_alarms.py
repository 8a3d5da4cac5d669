"""Alarms on a run's page access (:class:`AccessAlarmSettings`, under ``+search_monitor.alarms.access``): the model
stops opening pages after it had learnt to (``no_access``), or reads the same page over and over (``access_repeats``).

Invariant: a condition raises its alarm only once it has held ``patience`` steps in a row (one noisy step is not a
trend); a run without access metrics raises none. Once a run has shown access metrics, a step with search metrics but
none of access had not one trajectory call access: 0 pages opened.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


class AccessAlarmSettings(BaseModel):
    """``+search_monitor.alarms.access.<field>=...`` in verl's config (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pages_drop: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Alarm when pages opened per trajectory fall this fraction below their best moving average.",
    )
    pages_window: int = Field(default=5, ge=1, description="Steps in the moving average of pages opened.")
    min_learnt_pages: float = Field(
        default=0.2,
        gt=0,
        description="The level (pages per trajectory) the best moving average must reach before a drop from it counts: "
        "the model had learnt to open pages.",
    )
    max_repeat_share: float = Field(
        default=0.5, gt=0, le=1, description="Alarm when this share of a step's windows read re-read one already read."
    )
    min_windows: int = Field(
        default=20, ge=1, description="Windows read in a step below which their repeat share is not judged (too few)."
    )
    max_repeats_per_traj: int | None = Field(
        default=4, ge=1, description="Alarm when one trajectory re-reads windows this many times; None: off."
    )
    patience: int = Field(default=3, ge=1, description="Steps in a row a condition holds before its alarm starts.")


def _get(m: Mapping[str, float], key: str) -> float | None:
    value = m.get(key)
    return float(value) if isinstance(value, int | float) else None


class AccessWatch:
    """The access conditions of each step's metrics (``conditions``), for the collapse watcher to raise."""

    def __init__(self, settings: AccessAlarmSettings) -> None:
        self.settings = settings
        self._pages: deque[float] = deque(maxlen=settings.pages_window)
        self._best_pages: float | None = None
        self._seen = False  # the run has shown access metrics
        self._held: Counter[str] = Counter()  # steps in a row each condition has held

    def conditions(self, m: Mapping[str, float]) -> dict[str, str]:
        """The conditions that have held ``patience`` steps up to this one, each with its message."""
        found: dict[str, str] = {}
        pages = _get(m, "access/pages_per_traj/mean")
        self._seen = self._seen or pages is not None
        if pages is None and self._seen and _get(m, "search/calls_per_traj/mean") is not None:
            pages = 0.0
        if pages is not None and (message := self._pages_dropped(pages)):
            found["no_access"] = message
        if message := self._repeats(m):
            found["access_repeats"] = message
        self._held = Counter({name: self._held[name] + 1 for name in found})
        return {name: message for name, message in found.items() if self._held[name] >= self.settings.patience}

    def _pages_dropped(self, pages: float) -> str | None:
        s = self.settings
        self._pages.append(pages)
        if len(self._pages) == self._pages.maxlen:
            avg = sum(self._pages) / len(self._pages)
            self._best_pages = max(avg, self._best_pages or avg)
        best = self._best_pages
        if best is None or best < s.min_learnt_pages or pages > best * (1 - s.pages_drop):
            return None
        return (
            f"pages opened per trajectory fell to {pages:.2f}, {1 - pages / best:.0%} below their best "
            f"{s.pages_window}-step average {best:.2f} (alarm at {s.pages_drop:.0%})"
        )

    def _repeats(self, m: Mapping[str, float]) -> str | None:
        s = self.settings
        share, windows = _get(m, "access/repeat_share"), _get(m, "access/windows_read")
        if share is not None and windows is not None and windows >= s.min_windows and share >= s.max_repeat_share:
            return f"{share:.0%} of the {windows:.0f} windows read were re-reads (>= {s.max_repeat_share:.0%})"
        most = _get(m, "access/repeats_per_traj/max")
        if most is not None and s.max_repeats_per_traj is not None and most >= s.max_repeats_per_traj:
            return f"a trajectory re-read windows {most:.0f} times (>= {s.max_repeats_per_traj})"
        return None
