"""make train's before/after table carries each EM's standard error, and GRPO's gain is paired question by question
(the same held-out questions before and after), with its standard error."""

from __future__ import annotations

import json
import math

from cpu_bench.train.summary import Gain, StageResult, em_stderr, paired_gain, render_table


def _dump(folder, step: int, ems: list[float]) -> None:
    rows = [{"input": f"Question: q{i}?", "output": "<answer> x </answer>", "em": em} for i, em in enumerate(ems)]
    (folder / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_gain_is_paired_over_the_same_questions(tmp_path):
    _dump(tmp_path, 0, [0, 0, 1, 0, 1, 0, 0, 0])
    _dump(tmp_path, 6, [1, 0, 1, 1, 1, 0, 1, 0])
    gain = paired_gain(tmp_path)
    diffs = [1, 0, 0, 1, 0, 0, 1, 0]
    mean = sum(diffs) / 8
    assert gain.n == 8 and gain.gain == mean
    assert math.isclose(gain.stderr, math.sqrt(sum((d - mean) ** 2 for d in diffs) / 7 / 8))
    assert gain.describe().startswith("GRPO gain: +0.375 EM, standard error 0.183 (paired over the same 8 questions)")


def test_the_table_shows_each_ems_standard_error_and_the_gain():
    row = StageResult("after GRPO", "GRPO, 6 steps", 6, 100, 0.33, 0.48, 0.18, 1.51, 0.98, 0, 0.5)
    assert math.isclose(em_stderr(row), math.sqrt(0.33 * 0.67 / 100))
    table = render_table([row], Gain(0.26, 0.05, 100))
    assert "| EM | ± s.e. |" in table and "| 0.330 | 0.047 |" in table
    assert table.rstrip().endswith("+5.2 standard errors")
