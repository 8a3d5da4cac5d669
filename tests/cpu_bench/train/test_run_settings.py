"""A make-train run folder reuses its finished stages only under the settings that built them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_bench.train.__main__ import main
from cpu_bench.train.config import GRPOSettings, SFTSettings, TrainConfig
from cpu_bench.train.run_settings import FILE, SettingsMismatch, check_and_record


def _config(out: Path, **sections) -> TrainConfig:
    return TrainConfig(out_dir=out, **sections)


def test_same_settings_reuse_the_folder_and_where_it_runs_does_not_matter(tmp_path: Path) -> None:
    check_and_record(_config(tmp_path), tmp_path)
    recorded = json.loads((tmp_path / FILE).read_text())
    defaults = TrainConfig()
    assert (
        recorded["sft.epochs"] == defaults.sft.epochs
        and recorded["pretrain.task_steps"] == defaults.pretrain.task_steps
    )
    assert recorded["model.tokenizer_worlds"] == defaults.model.tokenizer_worlds and "out_dir" not in recorded
    check_and_record(TrainConfig(out_dir=tmp_path, retriever_url="http://127.0.0.1:9/retrieve"), tmp_path)


def test_changed_settings_are_refused_naming_each_change_and_nothing_is_rewritten(tmp_path: Path) -> None:
    check_and_record(_config(tmp_path), tmp_path)
    before = (tmp_path / FILE).read_text()
    with pytest.raises(SettingsMismatch, match=r"sft\.epochs: 1 -> 3") as caught:
        check_and_record(_config(tmp_path, sft=SFTSettings(epochs=3), grpo=GRPOSettings(steps=2)), tmp_path)
    assert "grpo.steps: 12 -> 2" in str(caught.value) and "another --out" in str(caught.value)
    assert (tmp_path / FILE).read_text() == before


def test_grpo_settings_may_change_only_once_the_grpo_stage_is_gone(tmp_path: Path) -> None:
    check_and_record(_config(tmp_path), tmp_path)
    (tmp_path / "grpo").mkdir()
    with pytest.raises(SettingsMismatch, match=r"only its grpo/ folder"):
        check_and_record(_config(tmp_path, grpo=GRPOSettings(steps=4)), tmp_path)
    (tmp_path / "grpo").rmdir()
    check_and_record(_config(tmp_path, grpo=GRPOSettings(steps=4)), tmp_path)
    assert json.loads((tmp_path / FILE).read_text())["grpo.steps"] == 4


def test_unreadable_settings_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text("{not json")
    with pytest.raises(SettingsMismatch, match="unreadable"):
        check_and_record(_config(tmp_path), tmp_path)


def test_cli_refuses_before_any_stage_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    check_and_record(_config(out), out)
    assert main(["--out", str(out), "--sft_epochs", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "sft.epochs: 1 -> 2" in err
    assert sorted(p.name for p in out.iterdir()) == [FILE], "no retriever, no stage"


def test_demo_pointed_at_a_make_train_folder_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train"
    check_and_record(_config(out), out)
    (out / "grpo").mkdir()
    (out / "grpo" / "done.json").write_text("{}")
    assert main(["--demo", "--out", str(out)]) == 1
    assert "baseline: True -> False" in capsys.readouterr().err
    assert (out / "grpo" / "done.json").is_file(), "the finished GRPO run is kept"


def test_a_grpo_redo_may_change_grpo_settings(tmp_path: Path) -> None:
    check_and_record(_config(tmp_path), tmp_path)
    (tmp_path / "grpo").mkdir()
    check_and_record(_config(tmp_path, grpo=GRPOSettings(steps=3)), tmp_path, redo_grpo=True)
