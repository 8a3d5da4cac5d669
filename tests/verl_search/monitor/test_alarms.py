"""The collapse watcher on recorded metric streams: each known signature raises its alarm once per episode, a healthy
run raises none, and stop_after ends a run only when asked."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from verl_search.monitor.trainer import AlarmSettings, CollapseWatcher


def step(searches=1.5, answered=0.9, clipped=0.0, failed=0.0, reward=0.4) -> dict[str, float]:
    """One step's metrics: every key the watcher reads."""
    return {
        "search/calls_per_traj/mean": searches,
        "search/answered_share": answered,
        "response_length/clip_ratio": clipped,
        "search/failed_share": failed,
        "critic/score/mean": reward,
    }


def run(stream: list[dict], **settings) -> tuple[CollapseWatcher, list[tuple[int, str]]]:
    watcher = CollapseWatcher(AlarmSettings(**settings))
    raised = [(i, a.name) for i, m in enumerate(stream, 1) for a in watcher.observe(i, m)]
    return watcher, raised


def test_a_healthy_run_raises_nothing():
    stream = [step(reward=0.2 + 0.02 * i, searches=1.0 + 0.1 * (i % 3)) for i in range(30)]
    watcher, raised = run(stream)
    assert raised == [] and not watcher.should_stop


def test_the_model_stops_searching_warns_once(caplog):
    stream = [step() for _ in range(6)] + [step(searches=0.0) for _ in range(10)]
    with caplog.at_level(logging.WARNING, logger="verl_search.monitor.trainer"):
        watcher, raised = run(stream)
    assert raised == [(7, "no_search")]
    assert [r.getMessage() for r in caplog.records] == [
        "search monitor: step 7: no_search: searches per trajectory fell to 0.000 (<= 0.05)"
    ]
    assert watcher.alarmed_steps == 10 and not watcher.should_stop  # the default never stops


def test_a_condition_that_clears_and_returns_warns_again():
    stream = [step()] * 4 + [step(answered=0.0)] * 2 + [step()] * 2 + [step(answered=0.01)]
    assert run(stream)[1] == [(5, "no_answer"), (9, "no_answer")]


def test_a_warm_start_may_vary_before_the_search_alarms_arm():
    assert run([step(searches=0.0)] * 3 + [step()] * 3)[1] == []


@pytest.mark.parametrize(
    ("late", "name"),
    [
        (step(searches=4.0), "search_every_turn"),
        (step(clipped=0.95), "length_cap"),
        (step(failed=0.6), "search_failures"),  # a retriever that starts failing mid-run
    ],
)
def test_each_signature(late, name):
    stream = [step()] * 5 + [late] * 3
    assert run(stream, max_searches=3.0)[1] == [(6, name)]


def test_reward_falling_from_its_best_average():
    stream = [step(reward=0.1 + 0.05 * i) for i in range(10)] + [step(reward=0.05)] * 8
    raised = run(stream, reward_window=3)[1]
    assert [n for _, n in raised] == ["reward_drop"] and 11 <= raised[0][0] <= 13


def test_stop_after_asks_to_stop_once_the_condition_held_that_long():
    stream = [step()] * 5 + [step(failed=0.9)] * 3
    watcher = CollapseWatcher(AlarmSettings(stop_after=2))
    stops = []
    for i, m in enumerate(stream, 1):
        watcher.observe(i, m)
        stops.append(watcher.should_stop)
    assert stops == [False] * 6 + [True, True]


def test_settings_are_checked():
    with pytest.raises(ValidationError):
        AlarmSettings(min_answered=2)
    with pytest.raises(ValidationError):
        AlarmSettings(max_searches=0.01)
    with pytest.raises(ValidationError, match="extra"):
        AlarmSettings(stop_afer=3)


def test_missing_metrics_are_skipped():
    watcher = CollapseWatcher()
    for i in range(10):
        assert watcher.observe(i, {"critic/score/mean": 0.5}) == []


def test_the_trainer_ends_the_loop_when_the_watcher_says_stop():
    """The mixin's hook: the step's metrics get the search metrics and the alarm count; a stop sets verl's
    total_training_steps to this step, so verl's loop ends after it (and logs its metrics)."""
    from omegaconf import OmegaConf

    from verl_search.monitor.trainer import SearchMetricsMixin

    class Base:
        def __init__(self, config) -> None:
            self.total_training_steps = 100

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch) -> None:
            metrics.update(step(failed=0.9))

    class Trainer(SearchMetricsMixin, Base):
        def _step_trajectories(self, batch) -> dict:
            return {"extra_fields": [{"search_calls": 2, "search_failures": 2, "search_failed_timeout": 2}]}

    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "search_sync"}},
                               "search_monitor": {"alarms": {"stop_after": 2}}})  # fmt: skip
    trainer = Trainer(config)
    for global_step in (1, 2):
        metrics: dict = {}
        trainer._compute_metrics(None, metrics, {}, global_step, 0)
    assert metrics["search/failed/timeout"] == 2 and metrics["search/alarm_steps"] == 2
    assert trainer.total_training_steps == 2
    bad = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}, "search_monitor": {"alarms": {"x": 1}}})
    from verl_search.errors import ConfigError

    with pytest.raises(ConfigError, match=r"search_monitor\.alarms\.x"):
        Trainer(bad)


STREAMS = Path(__file__).parent / "streams"


def _recorded(name: str) -> list[dict[str, float]]:
    """A real run's per-step metrics (verl's file logger), cut to the watched keys."""
    rows = [json.loads(line) for line in (STREAMS / name).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(set(r["data"]) <= set(step()) for r in rows)  # the keys the watcher reads
    return [r["data"] for r in rows]


@pytest.mark.parametrize("name", sorted(p.name for p in STREAMS.glob("*.jsonl")))
def test_real_make_demo_streams_raise_nothing_until_the_retriever_fails(name):
    """`make demo`'s GRPO steps as recorded on this project's CPUs: no alarm; the same steps with every search failing
    from step 3 (a retriever that went down) raise search_failures at step 3, and with the searches gone from step 4
    (past the warm-up) raise no_search there."""
    stream = _recorded(name)
    assert run(stream)[1] == []
    failing = [m if i < 3 else {**m, "search/failed_share": 1.0} for i, m in enumerate(stream, 1)]
    assert run(failing)[1] == [(3, "search_failures")]
    silent = [m if i < 4 else {**m, "search/calls_per_traj/mean": 0.0} for i, m in enumerate(stream, 1)]
    assert run(silent)[1] == [(4, "no_search")]
