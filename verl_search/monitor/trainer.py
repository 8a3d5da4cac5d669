"""verl's own V1 trainers, logging the search behaviour of every training step: ``trainer.v1.trainer_mode=search_sync``
(``search_colocate_async``, ``search_separate_async``) runs verl's trainer of that mode, adding the ``search/*``
metrics (:mod:`~verl_search.monitor.step_metrics`) to each step's metrics and watching them for collapse
(below); registered through verl's ``register_trainer`` by the plugin's import hook.

Collapse alarms (:class:`AlarmSettings`, under ``+search_monitor.alarms``): the model stops searching or searches every
turn, stops answering, runs into the length cap, its reward falls from its best moving average, or searches fail; and
on page access (:mod:`~verl_search.monitor.access_alarms`), it stops opening pages or re-reads the same ones.

Invariants: the trainer behaves as verl's of the same mode (the config names verl's mode again before verl reads it),
except that the synchronous one polls for finished rollouts every :data:`SYNC_POLL_INTERVAL_S`. The metrics never fail
a step (a failure is logged once and the step goes on without them). An alarm warns once per episode (when it starts,
again only after it has cleared); with ``stop_after`` N the run stops once any alarm has held N steps in a row (the
defaults never stop); missing metrics are skipped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from verl_search.monitor.access_alarms import AccessAlarmSettings, AccessWatch
from verl_search.monitor.step_metrics import search_step_metrics

logger = logging.getLogger(__name__)

#: our trainer modes and the verl mode each one runs
SEARCH_MODES = {
    "search_sync": "sync",
    "search_colocate_async": "colocate_async",
    "search_separate_async": "separate_async",
}


#: verl's ReplayBuffer polls for a finished batch this often (no config key reaches it); the synchronous trainer polls
#: its in-memory counters at the second value instead, the asynchronous ones keep verl's (an idle threshold there too)
VERL_POLL_INTERVAL_S = 2.0
SYNC_POLL_INTERVAL_S = 0.1


class SearchMetricsMixin:
    """Adds the step's ``search/*`` metrics to verl's (put before verl's trainer class in the bases)."""

    def __init__(self, config: Any) -> None:
        from omegaconf import open_dict

        mode = config.trainer.v1.trainer_mode
        with open_dict(config):
            config.trainer.v1.trainer_mode = SEARCH_MODES.get(mode, mode)
        self.search_watcher = CollapseWatcher(alarm_settings(config))
        self._search_metrics_failed = False
        super().__init__(config)

    def _build_replay_buffer(self):  # noqa: ANN202 (verl's ReplayBuffer, imported lazily)
        buffer = super()._build_replay_buffer()
        if self.trainer_mode == "sync" and getattr(buffer, "poll_interval", None) == VERL_POLL_INTERVAL_S:
            buffer.poll_interval = SYNC_POLL_INTERVAL_S
        return buffer

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):  # noqa: ANN001 (verl's signature)
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        try:
            metrics.update(search_step_metrics(**self._step_trajectories(batch)))
        except Exception:  # noqa: BLE001 - the run matters more than its metrics; say so once
            if not self._search_metrics_failed:
                logger.exception("verl_search: the search metrics of step %s could not be computed", global_steps)
            self._search_metrics_failed = True
        watcher = self.search_watcher
        watcher.observe(global_steps, metrics)
        metrics["search/alarm_steps"] = watcher.alarmed_steps
        if watcher.should_stop:  # the loop ends after this step; the last periodic checkpoint predates the collapse
            logger.error("search monitor: stopping the run after step %d: in alarm for %d steps (stop_after=%d): %s",
                         global_steps, watcher.alarmed_steps, watcher.settings.stop_after,
                         "; ".join(f"{a.name} since step {a.step}" for a in watcher.history[-5:]))  # fmt: skip
            self.total_training_steps = global_steps

    def _step_trajectories(self, batch) -> dict[str, Any]:  # noqa: ANN001
        """The arguments of :func:`search_step_metrics`: the step's real (not padding) trajectories."""
        import transfer_queue as tq

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[*_STEP_FIELDS, _MASK_FIELD]
        )
        real = [not tag.get("is_padding", False) for tag in batch.tags]
        fields, timings = (data.pop(name).tolist() for name in _STEP_FIELDS)
        lens = [tag.get("response_len") for tag in batch.tags]
        masked = masked_token_counts(data.pop(_MASK_FIELD), lens)
        multi_turn = self.config.actor_rollout_ref.rollout.multi_turn

        def kept(values: list[Any]) -> list[Any]:
            return [v for v, keep in zip(values, real, strict=True) if keep]

        return {
            "extra_fields": kept(fields),
            "timings": kept(timings),
            "response_lens": kept(lens),
            "masked_tokens": kept(masked),
            "max_result_chars": multi_turn.get("max_tool_response_length"),
        }


#: what the metrics read of each trajectory in verl's TransferQueue: ``extra_fields``, its loop's timings, its loss mask
_STEP_FIELDS = ["extra_fields", "metrics"]
_MASK_FIELD = "response_mask"


def masked_token_counts(masks: Any, response_lens: list[Any]) -> list[int | None]:
    """Per trajectory, its response tokens kept out of the loss (mask 0); ``masks`` nested or padded."""
    rows = masks.unbind(0) if getattr(masks, "is_nested", False) else list(masks)
    counts: list[int | None] = []
    for row, length in zip(rows, response_lens, strict=True):
        if length is None:
            counts.append(None)
            continue
        counts.append(int(length) - int(row[: int(length)].sum()))
    return counts


def alarm_settings(config: Any) -> AlarmSettings:
    """``search_monitor.alarms`` of verl's config (``+search_monitor.alarms.stop_after=3``), validated."""
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    from verl_search.errors import ConfigError, validation_text

    monitor = config.get("search_monitor") if hasattr(config, "get") else None
    raw = OmegaConf.to_container(monitor, resolve=True) if OmegaConf.is_config(monitor) else (monitor or {})
    try:
        return AlarmSettings(**(raw.get("alarms") or {}))
    except ValidationError as e:
        raise ConfigError(validation_text(e, "search_monitor.alarms")) from e


def register_search_trainers(v1: ModuleType) -> None:
    """Register a search trainer for each of verl's V1 modes (idempotent); ``v1`` is ``verl.trainer.ppo.v1``."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    for name, base_name in SEARCH_MODES.items():
        if name in TRAINER_REGISTRY or base_name not in TRAINER_REGISTRY:
            continue
        base = TRAINER_REGISTRY[base_name]
        cls = type(
            f"Search{base.__name__}",
            (SearchMetricsMixin, base),
            {"__module__": __name__, "__doc__": f"verl's {base.__name__} with per-step search metrics."},
        )
        v1.register_trainer(name)(cls)


class AlarmSettings(BaseModel):
    """``+search_monitor.alarms.<field>=...`` in verl's config (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Watch the step metrics at all.")
    min_searches: float = Field(
        default=0.05, ge=0, description="Alarm when searches per trajectory fall to this (the model stopped searching)."
    )
    max_searches: float | None = Field(
        default=None, ge=0, description="Alarm when searches per trajectory reach this (e.g. max turns - 1); None: off."
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
        description="Alarm when the reward's moving average falls this fraction below its best.",
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
    access: AccessAlarmSettings = Field(
        default_factory=AccessAlarmSettings, description="The alarms on page access (``alarms.access.<field>``)."
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
        self._access = AccessWatch(self.settings.access)
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
        found.update(self._access.conditions(m))
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
