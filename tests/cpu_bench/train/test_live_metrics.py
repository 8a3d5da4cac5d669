"""The live GRPO line: while verl trains in a child process, each step's row of its metrics JSONL becomes one console
line as soon as it is complete."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import time

from cpu_bench.train.live_metrics import MetricsTail, describe
from cpu_bench.train.processes import run_stage

ROW = {
    "critic/score/mean": 0.4125,
    "search/calls_per_traj/mean": 1.3125,
    "search/answered_share": 0.9,
    "timing_s/step": 37.6,
}


def test_a_step_row_reads_as_one_line():
    assert describe(2, ROW, 6) == "step 2/6: reward 0.412, searches/trajectory 1.31, answered 0.90, s/step 38"
    validation = {"val-core/searchR1_1hop/reward/mean@1": 0.25, "val-aux/x": 1}
    assert describe(0, validation, None) == "step 0: validation reward 0.250"
    validation["val-core/searchR1_2hop/reward/mean@1"] = 0.05
    assert describe(0, validation, None) == "step 0: validation reward 0.150 (mean of 2 data sources)"
    assert describe(1, {"actor/lr": 1e-4}, 6) == "step 1/6: no metrics yet"


def test_only_complete_rows_are_read_and_each_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path, "GRPO grpo", 6)
    assert tail.lines() == []  # no file yet
    first = json.dumps({"step": 1, "data": ROW}) + "\n"
    path.write_text(first + '{"step": 2, "da')  # verl is half-way through the next row
    assert tail.lines() == ["step 1/6: reward 0.412, searches/trajectory 1.31, answered 0.90, s/step 38"]
    assert tail.lines() == []
    path.write_text(first + json.dumps({"step": 2, "data": ROW}) + "\nnot json\n")
    assert [line.split(":")[0] for line in tail.lines()] == ["step 2/6"]


def test_run_stage_reports_rows_while_the_command_runs(tmp_path, caplog):
    """A stand-in trainer writes a row, waits, writes another: both are logged, the first before the command ends."""
    path = tmp_path / "metrics.jsonl"
    trainer = textwrap.dedent(
        f"""
        import json, time
        for step in (1, 2):
            with open({str(path)!r}, "a") as f:
                f.write(json.dumps({{"step": step, "data": {ROW!r}}}) + "\\n")
            time.sleep(1.0)
        """
    )
    tail = MetricsTail(path, "GRPO grpo", 2)
    with caplog.at_level(logging.INFO, logger="cpu_bench.train.live_metrics"):
        run_stage(
            "GRPO grpo", [sys.executable, "-c", trainer], tmp_path / "stage.log", watch=tail.poll, watch_every=0.3
        )
    ended = time.time()
    records = [r for r in caplog.records if r.name == "cpu_bench.train.live_metrics"]
    assert [r.getMessage().split(":")[1].strip() for r in records] == ["step 1/2", "step 2/2"]
    assert records[0].created < ended - 0.5  # step 1 was shown while the trainer still ran (it sleeps 1 s after 2)


def test_a_stage_shows_one_line_and_its_log_holds_the_full_command(tmp_path, caplog):
    log = tmp_path / "stage.log"
    command = [sys.executable, "-c", "print('trained')", *(f"key{i}=value {i}" for i in range(50))]
    with caplog.at_level(logging.INFO, logger="cpu_bench.train.processes"):
        run_stage("SFT sft", command, log)
    assert [r.getMessage() for r in caplog.records] == [f"SFT sft: running (log: {log})"]
    head, output = log.read_text().split("\n\n", 1)
    assert head.startswith("command: ") and "'key49=value 49'" in head and output == "trained\n"
