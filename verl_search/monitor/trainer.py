"""verl's own V1 trainers, logging the search behaviour of every training step: ``trainer.v1.trainer_mode=search_sync``
(``search_colocate_async``, ``search_separate_async``) runs verl's trainer of that mode, adding the ``search/*``
metrics (:mod:`~verl_search.monitor.step_metrics`) to each step's metrics and watching them for collapse
(:mod:`~verl_search.monitor.alarms`); registered through verl's ``register_trainer`` by the plugin's import hook.

Invariant: the trainer behaves as verl's of the same mode (the config names verl's mode again before verl reads it),
except that the synchronous one polls for finished rollouts every :data:`SYNC_POLL_INTERVAL_S`. The metrics never fail
a step (a failure is logged once and the step goes on without them).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from verl_search.monitor.alarms import AlarmSettings, CollapseWatcher
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
        """The step's real (not padding) trajectories from the TransferQueue batch, as
        :func:`search_step_metrics` reads them."""
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
