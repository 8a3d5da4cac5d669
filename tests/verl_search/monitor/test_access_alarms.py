"""The access alarms on realistic step sequences: each step's metrics are computed from a batch of trajectories as
AccessTool records them, the way the trainer computes them; each signature raises its alarm once, a healthy run none."""

from __future__ import annotations

import logging
import random

import pytest
from omegaconf import OmegaConf

from verl_search.errors import ConfigError
from verl_search.monitor.access_alarms import AccessAlarmSettings
from verl_search.monitor.step_metrics import search_step_metrics
from verl_search.monitor.trainer import AlarmSettings, CollapseWatcher, alarm_settings
from verl_search.tool.access_record import record_access
from verl_search.tool.access_tool import AccessOutcome

BATCH = 32


def trajectory(rng: random.Random, pages: float, rereads: float, loop: int = 0) -> dict:
    """One trajectory's extra_fields: it searches, opens about ``pages`` pages (reading one or two windows of each),
    re-reads each window it reads ``rereads`` times on average, and reads one window ``loop`` more times."""
    fields: dict = {"search_calls": 1, "reward_extra_info": {"num_searches": 1.0, "answered": 1.0}}
    opened = int(pages) + (rng.random() < pages - int(pages))
    read: list[tuple[str, int]] = []
    for p in range(opened):
        url = f"https://site{rng.randrange(10**6)}.org/{p}"
        for window in range(1, rng.choice((1, 2)) + 1):
            again = int(rereads) + (rng.random() < rereads - int(rereads))
            read += [(url, window)] * (1 + again)
    read += read[:1] * loop
    for url, window in read:
        record_access(fields, AccessOutcome(text="x", ok=True, page=window, latency_s=rng.uniform(0.05, 0.3)), url)
    return fields


def steps(*phases: tuple[int, dict], seed: int = 0) -> list[dict[str, float]]:
    """Per-step metrics of phases of ``(steps, trajectory settings)``; a phase's ``looping`` trajectories loop."""
    rng = random.Random(seed)
    stream = []
    for count, settings in phases:
        looping = settings.get("looping", 0)
        for _ in range(count):
            rows = [
                trajectory(rng, settings.get("pages", 1.0), settings.get("rereads", 0.05), loop=6 * (i < looping))
                for i in range(BATCH)
            ]
            stream.append(search_step_metrics(rows))
    return stream


def raised(stream: list[dict], **access) -> list[tuple[int, str]]:
    watcher = CollapseWatcher(AlarmSettings(access=AccessAlarmSettings(**access)))
    return [(i, a.name) for i, m in enumerate(stream, 1) for a in watcher.observe(i, m)]


def learning(pages: float = 1.2) -> list[tuple[int, dict]]:
    """A model that learns to open pages over 10 steps, then keeps it up."""
    return [(1, {"pages": pages * i / 10}) for i in range(10)] + [(10, {"pages": pages})]


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_run_raises_nothing(seed):
    assert raised(steps(*learning(), (30, {"pages": 1.0}), seed=seed)) == []


def test_a_small_noisy_batch_that_dips_for_a_step_raises_nothing():
    stream = steps(*learning(0.6), (1, {"pages": 0.0}), (10, {"pages": 0.6}), (2, {"pages": 0.1}), (10, {}))
    assert raised(stream) == []


def test_the_model_stops_opening_pages_warns_once(caplog):
    stream = steps(*learning(), (10, {"pages": 0.05}))  # steps 21-30: one trajectory in 20 opens a page
    with caplog.at_level(logging.WARNING, logger="verl_search.monitor.trainer"):
        assert raised(stream) == [(23, "no_access")]  # after 3 steps in a row
    assert "pages opened per trajectory fell to" in caplog.records[0].getMessage()


def test_the_model_stops_calling_access_at_all_warns_once():
    """No trajectory calls access: the step has search metrics but no access ones, which counts as 0 pages."""
    stream = steps(*learning()) + [{"search/calls_per_traj/mean": 1.0}] * 5
    assert raised(stream) == [(23, "no_access")]


def test_a_model_that_never_learnt_to_open_pages_is_not_a_drop():
    assert raised(steps((30, {"pages": 0.05}), (10, {"pages": 0.0}))) == []


def test_a_run_without_access_raises_no_access_alarm():
    stream = [{"search/calls_per_traj/mean": 1.5, "search/answered_share": 0.9}] * 20
    assert raised(stream) == [] and not any(k.startswith("access/") for k in stream[0])


def test_the_model_re_reads_the_same_windows_warns_once():
    stream = steps(*learning(), (10, {"rereads": 2.0}))  # from step 21 each window is read three times
    assert stream[-1]["access/repeat_share"] > 0.6
    assert raised(stream) == [(23, "access_repeats")]


def test_a_trajectory_reading_one_window_over_and_over_warns_once():
    stream = steps(*learning(), (10, {"looping": 1}))  # one trajectory per step re-reads a window 6 times
    assert stream[-1]["access/repeat_share"] < 0.5
    assert raised(stream) == [(23, "access_repeats")]
    assert raised(steps(*learning(), (1, {"looping": 1}), (10, {}))) == []  # once is not a trend
    assert raised(stream, max_repeats_per_traj=None) == []


def test_few_windows_read_are_not_judged_by_their_repeat_share():
    stream = steps((10, {"pages": 0.1, "rereads": 1.0}))  # about 10 windows a step, half of them re-reads
    assert raised(stream) == []
    assert [name for _, name in raised(stream, min_windows=5)] == ["access_repeats"]


def test_settings_are_checked_and_reach_the_watcher_from_verl_config():
    with pytest.raises(ValueError, match="pages_drop"):
        AccessAlarmSettings(pages_drop=0)
    config = OmegaConf.create({"search_monitor": {"alarms": {"access": {"patience": 1, "max_repeat_share": 0.3}}}})
    assert alarm_settings(config).access == AccessAlarmSettings(patience=1, max_repeat_share=0.3)
    bad = OmegaConf.create({"search_monitor": {"alarms": {"access": {"pages": 1}}}})
    with pytest.raises(ConfigError, match=r"search_monitor\.alarms\.access\.pages"):
        alarm_settings(bad)
