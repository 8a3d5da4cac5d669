"""The machine-wide base-model cache: a run folder's base model is stored once and restored into another run folder
whose base-model settings are the same (another seed, another --out, make demo); any other setting of the base
model, a half-written entry or a disabled cache gives no restore."""

from __future__ import annotations

import json

import pytest

from verl_search.train import base_cache
from verl_search.train.config import GRPOSettings, PretrainSettings, TrainConfig, WorldSettings


@pytest.fixture(autouse=True)
def machine_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path / "machine"))
    monkeypatch.delenv(base_cache.ENV_DISABLE, raising=False)
    return tmp_path / "machine" / "base_models"


def built_run(folder, marker="weights of run A"):
    """A run folder as the base-model stage leaves it (model files reduced to a marker)."""
    for part in base_cache.PARTS:
        (folder / part).mkdir(parents=True)
        (folder / part / "config.json").write_text("{}")
        (folder / part / "model.safetensors").write_text(marker)
    (folder / "base_model.json").write_text(json.dumps({"seconds": 600.0}))
    return folder


def test_a_run_with_another_split_seed_and_grpo_settings_gets_the_stored_base_model(tmp_path, machine_cache):
    config = TrainConfig(out_dir=tmp_path / "a")
    entry = base_cache.store(config, built_run(tmp_path / "a"))
    assert entry is not None and entry.parent == machine_cache
    other = TrainConfig(
        out_dir=tmp_path / "b", world=WorldSettings(split_seed=1), grpo=GRPOSettings(steps=3), baseline=False
    )
    assert base_cache.restore(other, tmp_path / "b") == entry
    for part in base_cache.PARTS:
        assert (tmp_path / "b" / part / "model.safetensors").read_text() == "weights of run A"
    assert json.loads((tmp_path / "b" / "base_model.json").read_text()) == {"seconds": 600.0}


@pytest.mark.parametrize(
    "change",
    [
        {"pretrain": PretrainSettings(task_steps=10)},
        {"world": WorldSettings(world_seed=3)},
        {"model": TrainConfig().model.model_copy(update={"layers": 2})},
        {"search": TrainConfig().search.model_copy(update={"max_result_chars": 200})},
    ],
    ids=["pretrain steps", "world seed", "model size", "search results"],
)
def test_another_base_model_setting_is_not_restored(tmp_path, change):
    base_cache.store(TrainConfig(out_dir=tmp_path / "a"), built_run(tmp_path / "a"))
    assert base_cache.restore(TrainConfig(out_dir=tmp_path / "b", **change), tmp_path / "b") is None
    assert not (tmp_path / "b" / "base_model").exists()


def test_a_folder_with_its_own_base_model_keeps_it(tmp_path):
    base_cache.store(TrainConfig(), built_run(tmp_path / "a"))
    built_run(tmp_path / "b", marker="weights of run B")
    assert base_cache.restore(TrainConfig(), tmp_path / "b") is None
    assert (tmp_path / "b" / "base_model" / "model.safetensors").read_text() == "weights of run B"


def test_an_incomplete_entry_is_not_restored_and_the_next_store_replaces_it(tmp_path, machine_cache):
    entry = machine_cache / base_cache.base_key(TrainConfig())
    (entry / "initial_model").mkdir(parents=True)  # a copy cut short by hand: no base model, no done file
    (entry / "initial_model" / "config.json").write_text("{}")
    assert base_cache.restore(TrainConfig(), tmp_path / "b") is None
    built_run(tmp_path / "a")
    assert base_cache.store(TrainConfig(), tmp_path / "a") == entry  # replaced, not merged into
    assert base_cache.restore(TrainConfig(), tmp_path / "b") == entry
    assert (tmp_path / "b" / "base_model" / "model.safetensors").read_text() == "weights of run A"


def test_an_unfinished_run_is_not_stored(tmp_path, machine_cache):
    folder = built_run(tmp_path / "a")
    (folder / "base_model.json").unlink()  # killed before the stage finished
    assert base_cache.store(TrainConfig(), folder) is None
    assert not machine_cache.exists() or not any(machine_cache.iterdir())


def test_the_cache_can_be_switched_off(tmp_path, monkeypatch, machine_cache):
    monkeypatch.setenv(base_cache.ENV_DISABLE, "1")
    assert base_cache.store(TrainConfig(), built_run(tmp_path / "a")) is None
    assert not machine_cache.exists()
    monkeypatch.setenv(base_cache.ENV_DISABLE, "0")
    assert base_cache.store(TrainConfig(), tmp_path / "a") is not None
    monkeypatch.setenv(base_cache.ENV_DISABLE, "yes")
    assert base_cache.restore(TrainConfig(), tmp_path / "b") is None
