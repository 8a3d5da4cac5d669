"""One stage abstraction for every stage of make train: a finished stage is reused, a changed key or an unfinished
build is rebuilt, and folders finished under the older markers (done.json, config.json) are reused, not rebuilt."""

from __future__ import annotations

import json

import pytest

from cpu_bench.train.stage import MARKER, Stage, legacy_seconds


def counting_stage(folder, key, calls, legacy=None, staged=False):
    def build(out):
        calls.append(out)
        (out / "model.txt").write_text(f"built with {key}")
        return {"rows": 3}

    return Stage("test", folder, key, build, legacy, staged=staged)


@pytest.mark.parametrize("staged", [False, True], ids=["in place", "staged"])
def test_a_done_stage_is_reused_with_its_seconds_and_info(tmp_path, staged):
    calls = []
    first = counting_stage(tmp_path / "s", {"lr": 1e-3}, calls, staged=staged).ensure()
    again = counting_stage(tmp_path / "s", {"lr": 1e-3}, calls, staged=staged).ensure()
    assert len(calls) == 1 and not first.reused and again.reused
    assert again.seconds == pytest.approx(first.seconds) and again.info == {"rows": 3}
    assert json.loads((tmp_path / "s" / MARKER).read_text())["key"] == {"lr": 1e-3}


def test_a_changed_key_is_rebuilt_from_an_empty_folder(tmp_path):
    calls = []
    counting_stage(tmp_path / "s", {"lr": 1e-3}, calls).ensure()
    (tmp_path / "s" / "stale.txt").write_text("left by the first build")
    record = counting_stage(tmp_path / "s", {"lr": 2e-3}, calls).ensure()
    assert len(calls) == 2 and not record.reused
    assert not (tmp_path / "s" / "stale.txt").exists()
    assert (tmp_path / "s" / "model.txt").read_text() == "built with {'lr': 0.002}"


def test_an_unfinished_build_is_rebuilt(tmp_path):
    def crash(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        Stage("test", tmp_path / "s", {"a": 1}, crash).ensure()
    assert not (tmp_path / "s" / MARKER).exists()
    calls = []
    record = counting_stage(tmp_path / "s", {"a": 1}, calls).ensure()
    assert len(calls) == 1 and not record.reused and not (tmp_path / "s" / "half.txt").exists()


def test_a_staged_build_that_fails_leaves_no_folder(tmp_path):
    def crash(out):
        (out / "half.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        Stage("test", tmp_path / "entry", {"a": 1}, crash, staged=True).ensure()
    assert not (tmp_path / "entry").exists() and list(tmp_path.iterdir()) == []


def test_tuples_and_paths_in_a_key_compare_equal_after_the_round_trip(tmp_path):
    calls = []
    counting_stage(tmp_path / "s", {"span": (4, 10), "path": tmp_path}, calls).ensure()
    assert counting_stage(tmp_path / "s", {"span": (4, 10), "path": tmp_path}, calls).ensure().reused


def test_a_folder_of_the_old_done_json_convention_is_reused_with_its_seconds(tmp_path):
    """A GRPO run folder of an earlier version (done.json, no stage.json) is not trained again."""
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "done.json").write_text(json.dumps({"seconds": 321.0}))
    calls = []
    record = counting_stage(run, {"grpo": 1}, calls, legacy_seconds("done.json", "done.json")).ensure()
    assert calls == [] and record.reused and record.seconds == 321.0


def test_a_model_folder_of_the_old_config_json_convention_is_reused(tmp_path):
    sft = tmp_path / "sft"
    (sft / "model").mkdir(parents=True)
    (sft / "model" / "config.json").write_text("{}")
    calls = []
    record = counting_stage(sft, {"sft": 1}, calls, legacy_seconds("model/config.json", "done.json")).ensure()
    assert calls == [] and record.reused and record.seconds == 0.0


def test_an_old_folder_without_its_required_seconds_file_is_unfinished(tmp_path):
    base = tmp_path / "base_model"
    base.mkdir()
    (base / "config.json").write_text("{}")  # killed before base_model.json was written
    calls = []
    legacy = legacy_seconds("config.json", "../base_model.json", required=True)
    assert not counting_stage(base, {"k": 1}, calls, legacy).ensure().reused and len(calls) == 1
