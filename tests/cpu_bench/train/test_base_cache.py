"""The machine-wide base-model cache: a run folder's base model is stored once and restored into another run folder
whose base-model settings are the same (another seed, another --out, make demo); any other setting of the base
model, a half-written entry or a disabled cache gives no restore."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cpu_bench.train import base_cache
from cpu_bench.train.config import GRPOSettings, PretrainSettings, TrainConfig, WorldSettings
from cpu_bench.train.sft_data import RowSettings
from verl_search.data.templates import load_templates

REPO = Path(__file__).resolve().parents[3]
_TEMPLATES = load_templates(REPO / "data_preprocess" / "prompt.yaml")
#: the rows as make train renders them (the tool's schemas reduced to one stand-in)
ROWS = RowSettings(
    hermes_template=_TEMPLATES.get("tool_call")[1],
    native_template=_TEMPLATES.get("search_r1")[1],
    tool_schemas=[{"type": "function", "function": {"name": "search"}}],
)


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
    entry = base_cache.store(config, ROWS, built_run(tmp_path / "a"))
    assert entry is not None and entry.parent == machine_cache
    search = config.search.model_copy(update={"no_search_share": 0.0, "hermes_share": 0.5})  # SFT data only
    other = TrainConfig(
        out_dir=tmp_path / "b",
        world=WorldSettings(split_seed=1, sft_questions=500),
        search=search,
        grpo=GRPOSettings(steps=3),
        baseline=False,
    )
    assert base_cache.restore(other, ROWS, tmp_path / "b") == entry
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
    base_cache.store(TrainConfig(out_dir=tmp_path / "a"), ROWS, built_run(tmp_path / "a"))
    assert base_cache.restore(TrainConfig(out_dir=tmp_path / "b", **change), ROWS, tmp_path / "b") is None
    assert not (tmp_path / "b" / "base_model").exists()


def test_an_edited_prompt_template_is_not_restored(tmp_path):
    base_cache.store(TrainConfig(), ROWS, built_run(tmp_path / "a"))
    native = ROWS.native_template.model_copy(update={"user": ROWS.native_template.user + " Be brief."})
    assert base_cache.restore(TrainConfig(), replace(ROWS, native_template=native), tmp_path / "b") is None


def test_a_tokenizer_learnt_on_the_evaluated_world_keys_on_its_size(tmp_path):
    def own_world(passages):
        model = TrainConfig().model.model_copy(update={"tokenizer_worlds": 0})
        return TrainConfig(model=model, world=WorldSettings(passages=passages))

    base_cache.store(own_world(2000), ROWS, built_run(tmp_path / "a"))
    assert base_cache.restore(own_world(500), ROWS, tmp_path / "b") is None
    assert base_cache.restore(own_world(2000), ROWS, tmp_path / "b") is not None


def test_a_folder_with_its_own_base_model_keeps_it(tmp_path):
    base_cache.store(TrainConfig(), ROWS, built_run(tmp_path / "a"))
    built_run(tmp_path / "b", marker="weights of run B")
    assert base_cache.restore(TrainConfig(), ROWS, tmp_path / "b") is None
    assert (tmp_path / "b" / "base_model" / "model.safetensors").read_text() == "weights of run B"


def test_an_incomplete_entry_is_not_restored_and_the_next_store_replaces_it(tmp_path, machine_cache):
    entry = machine_cache / base_cache.base_key(TrainConfig(), ROWS)
    (entry / "initial_model").mkdir(parents=True)  # a copy cut short by hand: no base model, no done file
    (entry / "initial_model" / "config.json").write_text("{}")
    assert base_cache.restore(TrainConfig(), ROWS, tmp_path / "b") is None
    built_run(tmp_path / "a")
    assert base_cache.store(TrainConfig(), ROWS, tmp_path / "a") == entry  # replaced, not merged into
    assert base_cache.restore(TrainConfig(), ROWS, tmp_path / "b") == entry
    assert (tmp_path / "b" / "base_model" / "model.safetensors").read_text() == "weights of run A"


def test_an_unfinished_run_is_not_stored(tmp_path, machine_cache):
    folder = built_run(tmp_path / "a")
    (folder / "base_model.json").unlink()  # killed before the stage finished
    assert base_cache.store(TrainConfig(), ROWS, folder) is None
    assert not machine_cache.exists() or not any(machine_cache.iterdir())


def test_the_cache_can_be_switched_off(tmp_path, monkeypatch, machine_cache):
    monkeypatch.setenv(base_cache.ENV_DISABLE, "1")
    assert base_cache.store(TrainConfig(), ROWS, built_run(tmp_path / "a")) is None
    assert not machine_cache.exists()
    monkeypatch.setenv(base_cache.ENV_DISABLE, "0")
    assert base_cache.store(TrainConfig(), ROWS, tmp_path / "a") is not None
    monkeypatch.setenv(base_cache.ENV_DISABLE, "yes")
    assert base_cache.restore(TrainConfig(), ROWS, tmp_path / "b") is None


def built_run_with_markers(config, folder, marker="weights of run A"):
    """A run folder as this version's stages leave it: each part with its stage marker, no base_model.json."""
    from cpu_bench.train.base_model import base_stage, initial_stage
    from cpu_bench.train.stage import write_marker

    for stage in (initial_stage(config, ROWS, folder), base_stage(config, ROWS, folder)):
        stage.folder.mkdir(parents=True)
        (stage.folder / "config.json").write_text("{}")
        (stage.folder / "model.safetensors").write_text(marker)
        write_marker(stage.folder, stage.name, stage.key, 600.0)
    return folder


@pytest.mark.parametrize("sft_only", [{}, {"no_search_share": 0.5}, {"hermes_share": 0.0}], ids=str)
def test_a_run_of_stage_markers_is_stored_and_restored_as_done_stages(tmp_path, sft_only):
    """Restored into a run whose SFT-only search settings differ (make demo --no_search_share 0.5), the base model
    is a finished stage there too: it was rebuilt (17 minutes) because its stage key held those settings."""
    from cpu_bench.train.base_model import base_stage

    config = TrainConfig()
    entry = base_cache.store(config, ROWS, built_run_with_markers(config, tmp_path / "a"))
    assert entry is not None and (entry / "stage.json").is_file()
    other = TrainConfig(search=config.search.model_copy(update=sft_only))
    assert base_cache.restore(other, ROWS, tmp_path / "b") == entry
    record = base_stage(other, ROWS, tmp_path / "b").done()
    assert record is not None and record.seconds == 600.0  # the restored base model is a finished stage: not rebuilt
