"""What a finished ``make train``/``make demo`` writes last: summary.json (read by ``make train-seeds``) and the table,
with the gain, this run's times and the stages it reused."""

from __future__ import annotations

import json
from pathlib import Path

from cpu_bench.train.pipeline import PipelineResult, write_summary
from cpu_bench.train.seeds import read_run
from cpu_bench.train.summary import Gain, StageResult


def _row(stage: str, em: float) -> StageResult:
    return StageResult(stage, "what", 0, 100, em, em, em, 1.0, 1.0, 0, 0.5)


def test_summary_holds_the_gain_the_times_and_the_reused_stages(tmp_path: Path) -> None:
    result = PipelineResult(
        [_row("after SFT", 0.07), _row("after GRPO", 0.38)],
        {"retriever_start": 4.0, "sft": 284.0, "grpo": 234.0, "total": 241.0},
        {"plots": "p"},
        gain=Gain(0.31, 0.049, 100),
        reused={"sft": "built before"},
    )
    write_summary(tmp_path, result, {"sft_trajectories": 542})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["grpo_gain"] == {"gain": 0.31, "stderr": 0.049, "n": 100}
    assert summary["reused"] == {"sft": "built before"} and summary["seconds"]["total"] == 241.0
    assert summary["data"] == {"sft_trajectories": 542}
    assert "| after GRPO |" in (tmp_path / "summary.md").read_text()
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "metrics.jsonl").write_text("")
    run = read_run(tmp_path)  # what make train-seeds reads back
    assert (run.em_sft, run.em_grpo, run.gain, run.stderr) == (0.07, 0.38, 0.31, 0.049)
