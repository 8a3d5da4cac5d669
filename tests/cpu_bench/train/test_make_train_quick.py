"""``python -m cpu_bench.train --quick`` (the shortened ``make train``) runs every stage on this CPU and writes every
artifact: both SFT models, the GRPO checkpoint, the validation dumps and report, the plots and the table. Learning is
not asserted (the quick sizes are far too small to learn)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_quick_pipeline_writes_every_artifact(tmp_path):
    out = tmp_path / "train"
    process = subprocess.run(
        [sys.executable, "-m", "cpu_bench.train", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHONPATH": str(REPO), "VERL_SEARCH_CACHE": str(tmp_path / "cache")},
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    for model in ("sft/model", "sft_answer_only/model", "initial_model", "pretrain_copy", "base_model"):
        assert (out / model / "config.json").is_file() and (out / model / "model.safetensors").is_file()
    assert (out / "grpo" / "checkpoints" / "global_step_2" / "actor").is_dir()
    dumps = sorted(p.name for p in (out / "grpo" / "val_generations").glob("*.jsonl"))
    assert dumps == ["0.jsonl", "1.jsonl", "2.jsonl"]  # before training (the SFT model), then every step
    assert (out / "grpo" / "val_generations" / "report.md").is_file()
    assert (out / "eval_answer_only" / "val_generations" / "0.jsonl").is_file()
    pngs = {p.name for p in (out / "plots").glob("*.png")}
    assert {"training_curves.png", "reward_em.png", "searches.png", "response_length.png"} <= pngs
    assert all((out / "plots" / name).stat().st_size > 1000 for name in pngs)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["stage"] for r in summary["results"]] == ["no-search baseline", "after SFT", "after GRPO"]
    assert all(r["n"] == 8 for r in summary["results"])
    assert "| after GRPO |" in process.stdout  # the table is printed
    stages = re.findall(r"\[(\d)/5\] ([a-zA-Z -]+):", process.stderr)  # the line before each stage
    names = ["retriever and data", "base model", "SFT warm start", "no-search baseline", "GRPO"]
    assert stages == [(str(i), name) for i, name in enumerate(names, 1)]
    assert "after GRPO" in (out / "summary.md").read_text()
    cached = list((tmp_path / "cache" / "base_models").glob("*/base_model/model.safetensors"))
    assert len(cached) == 1  # the next run folder on this machine starts from it
