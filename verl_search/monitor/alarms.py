"""Collapse alarms: the known ways a search-RL run goes wrong, recognised from each step's metrics.

The model stops searching or searches every turn, stops answering, runs into the length cap, its reward falls from
its best moving average, or its searches fail (each a setting below).

Invariants: a condition warns once per episode (when it starts, again only after it has cleared); with ``stop_after``
N the run stops once any condition has held N steps in a row (the defaults never stop); missing metrics are skipped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger(__name__)


class AlarmSettings(BaseModel):
    """``+search_monitor.alarms.<field>=...`` in verl's config (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Watch the step metrics at all.")
    min_searches: float = Field(
        default=0.05, ge=0, description="Alarm when searches per trajectory fall to this (the model stopped searching)."
    )
    max_searches: float | None = Field(
        default=None,
        ge=0,
        description="Alarm when searches per trajectory reach this (the model searches every turn it has; set it to "
        "the loop's max turns - 1). None: off.",
    )
    min_answered: float = Field(
        default=0.05, ge=0, le=1, description="Alarm when the share of trajectories that answer falls to this."
    )
    max_clip_ratio: float = Field(
        default=0.9, ge=0, le=1, description="Alarm when this share of responses reaches the response-length cap."
    )
    reward_drop: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Alarm when the reward's moving average falls this fraction below its best moving average.",
    )
    reward_window: int = Field(default=5, ge=1, description="Steps in the reward's moving average.")
    max_failed_share: float = Field(
        default=0.2, ge=0, le=1, description="Alarm when this share of search calls fails (timeouts, 429, errors)."
    )
    warmup_steps: int = Field(
        default=3, ge=0, description="Steps before the alarms on searching and answering arm (a warm start may vary)."
    )
    stop_after: int = Field(
        default=0, ge=0, description="Stop the run after this many steps in a row in alarm (0: warn only, never stop)."
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> AlarmSettings:
        if self.max_searches is not None and self.max_searches <= self.min_searches:
            raise ValueError("max_searches must be above min_searches")
        return self


@dataclass(frozen=True)
class Alarm:
    """One condition that started at ``step``; ``message`` names it and its numbers."""

    name: str
    step: int
    message: str


class CollapseWatcher:
    """Feed it each step's metrics (``observe``); it warns once per episode and says when to stop."""

    def __init__(self, settings: AlarmSettings | None = None) -> None:
        self.settings = settings or AlarmSettings()
        self._active: set[str] = set()
        self._rewards: deque[float] = deque(maxlen=self.settings.reward_window)
        self._best_reward_avg: float | None = None
        self._steps_seen = 0
        self.alarmed_steps = 0  # consecutive steps with at least one condition
        self.history: list[Alarm] = []

    @property
    def should_stop(self) -> bool:
        return self.settings.stop_after > 0 and self.alarmed_steps >= self.settings.stop_after

    def _conditions(self, m: Mapping[str, float]) -> dict[str, str]:
        s = self.settings
        found: dict[str, str] = {}
        armed = self._steps_seen > s.warmup_steps

        def get(key: str) -> float | None:
            value = m.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        searches = get("search/calls_per_traj/mean")
        if armed and searches is not None and searches <= s.min_searches:
            found["no_search"] = f"searches per trajectory fell to {searches:.3f} (<= {s.min_searches})"
        if searches is not None and s.max_searches is not None and searches >= s.max_searches:
            found["search_every_turn"] = f"searches per trajectory reached {searches:.2f} (>= {s.max_searches})"
        answered = get("search/answered_share")
        if armed and answered is not None and answered <= s.min_answered:
            found["no_answer"] = f"only {answered:.1%} of trajectories answer (<= {s.min_answered:.0%})"
        clipped = get("response_length/clip_ratio")
        if clipped is not None and clipped >= s.max_clip_ratio:
            found["length_cap"] = f"{clipped:.0%} of responses hit the length cap (>= {s.max_clip_ratio:.0%})"
        failed = get("search/failed_share")
        if failed is not None and failed > s.max_failed_share:
            found["search_failures"] = f"{failed:.0%} of search calls failed (> {s.max_failed_share:.0%})"
        reward = get("critic/score/mean")
        if reward is not None:
            self._rewards.append(reward)
            if len(self._rewards) == self._rewards.maxlen:
                avg = sum(self._rewards) / len(self._rewards)
                best = self._best_reward_avg = max(avg, self._best_reward_avg or avg)
                if best > 0 and avg <= best * (1 - s.reward_drop):
                    found["reward_drop"] = (
                        f"reward's {s.reward_window}-step average {avg:.3f} is {1 - avg / best:.0%} below its best "
                        f"{best:.3f} (alarm at {s.reward_drop:.0%})"
                    )
        return found

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[Alarm]:
        """The alarms that start at this step (each logged once as a warning)."""
        if not self.settings.enabled:
            return []
        self._steps_seen += 1
        found = self._conditions(metrics)
        started = [Alarm(name, step, message) for name, message in found.items() if name not in self._active]
        for name in self._active - found.keys():
            logger.warning("search monitor: step %d: %s cleared", step, name)
        self._active = set(found)
        self.alarmed_steps = self.alarmed_steps + 1 if found else 0
        for alarm in started:
            logger.warning("search monitor: step %d: %s: %s", step, alarm.name, alarm.message)
        self.history += started
        return started
