"""python -m cpu_bench.train.seeds: several make train runs as one table (mean, spread, the target met or not) and
one plot of the curves with a band over the runs."""

from __future__ import annotations

import json
from pathlib import Path

from cpu_bench.train.seeds import main


def fake_run(folder: Path, em_sft: float, em_grpo: float, stderr: float, rewards: list[float]) -> Path:
    """What make train leaves that the command reads: summary.json and GRPO's file-logger metrics."""
    (folder / "grpo").mkdir(parents=True)
    results = [{"stage": "no-search baseline", "em": 0.0}, {"stage": "after SFT", "em": em_sft},
               {"stage": "after GRPO", "em": em_grpo}]  # fmt: skip
    gain = {"gain": round(em_grpo - em_sft, 2), "stderr": stderr, "n": 100}
    (folder / "summary.json").write_text(json.dumps({"results": results, "grpo_gain": gain}))
    lines = [{"step": 0, "data": {"val-core/nq/reward/mean@1": em_sft, "val-core/hotpot/reward/mean@1": em_sft}}]
    for step, reward in enumerate(rewards, start=1):
        lines.append({"step": step, "data": {"critic/score/mean": reward, "search/calls_per_traj/mean": step / 2}})
    (folder / "grpo" / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    return folder


def test_the_table_says_mean_spread_and_how_many_runs_reached_the_target(tmp_path, capsys):
    runs = [fake_run(tmp_path / "seed0", 0.07, 0.33, 0.05, [0.1, 0.2]),
            fake_run(tmp_path / "seed1", 0.00, 0.05, 0.02, [0.0, 0.1, 0.3])]  # fmt: skip
    assert main([str(r) for r in runs] + ["--out", str(tmp_path / "seeds")]) == 0
    out = capsys.readouterr().out
    assert "| seed0 | 0.07 | 0.33 | +0.26 ± 0.05 | 5.2 |" in out
    assert "| seed1 | 0.00 | 0.05 | +0.05 ± 0.02 | 2.5 |" in out
    assert "| mean of 2 | 0.04 | 0.19 | +0.15 (s.d. 0.15, +0.05 … +0.26) | |" in out
    assert "Gain ≥ +0.10 in 1 of 2 runs." in out
    assert (tmp_path / "seeds" / "seeds.md").read_text(encoding="utf-8") in out
    png = tmp_path / "seeds" / "training_curves_seeds.png"
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_folder_that_is_not_a_finished_run_is_named(tmp_path, capsys):
    good = fake_run(tmp_path / "seed0", 0.07, 0.33, 0.05, [0.1])
    (tmp_path / "half").mkdir()
    assert main([str(good), str(tmp_path / "half")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("seeds: error: ") and "half" in err and "not a finished make train run" in err
