"""The line before each stage of make train / make demo: numbered, with what runs and its expected time."""

from __future__ import annotations

import logging
from pathlib import Path

from cpu_bench.train.config import GRPOSettings, TrainConfig, demo_config
from cpu_bench.train.progress import Progress, base_model_seconds, duration, grpo_seconds, sft_seconds


def test_the_demo_stages_are_expected_to_take_what_a_fresh_clone_measured():
    """The paces a fresh clone's make demo measured (docs/results/training.md): SFT 105 s on 1,382 trajectories,
    GRPO 214 s, the base model 745 s when built."""
    demo = demo_config(Path("demo"))
    assert duration(sft_seconds(1382, demo, 1)) == "about 2 min"
    six_steps = TrainConfig(grpo=GRPOSettings(steps=6, test_freq=6))  # the demo's GRPO until 2026-11-25: 175-218 s
    assert 180 <= grpo_seconds(six_steps) <= 260
    assert duration(base_model_seconds(TrainConfig())) == "about 12 min"
    assert grpo_seconds(TrainConfig()) > grpo_seconds(demo) > grpo_seconds(six_steps)  # 12, 8 and 6 steps


def test_short_and_long_durations_read_naturally():
    assert duration(42) == "about 40 s"
    assert duration(89) == "about 90 s"
    assert duration(400) == "about 7 min"


def test_each_stage_gets_a_numbered_line(caplog):
    progress = Progress(3)
    with caplog.at_level(logging.INFO, logger="cpu_bench.train.progress"):
        progress.stage("SFT warm start", "verl's SFT trainer", 105)
        progress.stage("base model", "restored from the repository", None)
    assert caplog.messages == [
        "[1/3] SFT warm start: verl's SFT trainer (about 2 min on 2 CPU cores)",
        "[2/3] base model: restored from the repository",
    ]
