"""The base model shipped in the repository: it is what the code builds (recipe, settings, tokenizer, held-out score),
and a run restores it only when it is the one the run would build."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from cpu_bench.train import base_rebuild, shipped_base
from cpu_bench.train.base_model import base_stage, initial_stage
from cpu_bench.train.config import PretrainSettings, TrainConfig, demo_config, quick_config
from cpu_bench.train.shipped_base import SHIPPED, Manifest, ShippedBaseError
from verl_search.errors import VerlSearchError


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return shipped_base.rows_for(TrainConfig(), tmp_path_factory.mktemp("rows"))


def test_the_shipped_model_is_what_the_code_builds_now():
    """Weights and tokenizer are the manifest's, and the code that builds the base model is the code it was built
    by (else: `make base-model UPDATE=1`)."""
    manifest = shipped_base.check_files()
    assert manifest.heldout["rows"] == shipped_base.HELDOUT_ROWS


def test_the_default_and_demo_settings_restore_the_shipped_model(tmp_path, rows):
    for config in (TrainConfig(out_dir=tmp_path / "train"), demo_config(tmp_path / "demo")):
        assert shipped_base.usable(config, rows, Path(config.out_dir)) is not None


def test_the_tokenizer_the_code_learns_is_the_shipped_one(tmp_path, rows):
    initial = initial_stage(TrainConfig(out_dir=tmp_path), rows, tmp_path)
    initial.ensure()
    assert shipped_base.tokenizer_fingerprint(initial.folder) == Manifest.read().tokenizer


def test_the_shipped_weights_give_their_recorded_held_out_score(tmp_path, rows):
    score = shipped_base.heldout_loss(SHIPPED / "base_model", TrainConfig(), rows, tmp_path)
    recorded = Manifest.read().heldout
    assert score["world"] == recorded["world"] and score["rows"] == recorded["rows"]
    assert score["loss"] == pytest.approx(recorded["loss"], rel=1e-3)


def test_a_run_restores_it_as_its_finished_base_model_stage(tmp_path, rows):
    config = demo_config(tmp_path)
    assert shipped_base.restore(config, rows, tmp_path)
    assert base_stage(config, rows, tmp_path).done() is not None
    assert shipped_base.file_sha256(tmp_path / "base_model" / "model.safetensors") == Manifest.read().weights_sha256
    assert not shipped_base.restore(config, rows, tmp_path)  # a folder with its own base model keeps it


@pytest.mark.parametrize("change", [{"task_steps": 1999}, {"lr": 2e-3}, {"enabled": False}])
def test_a_run_with_other_base_model_settings_builds_its_own(tmp_path, rows, change):
    config = TrainConfig(out_dir=tmp_path, pretrain=PretrainSettings(**change))
    assert not shipped_base.restore(config, rows, tmp_path)
    assert not (tmp_path / "base_model").exists()


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    """A model built and shipped at the quick sizes into a folder of the module's own."""
    root = tmp_path_factory.mktemp("quick")
    config = quick_config(root / "build")
    comparison, manifest = base_rebuild.rebuild(root / "build", root / "shipped", config)
    assert comparison.shipped_loss is None and not comparison.matches
    base_rebuild.ship(root / "build" / "base_model", manifest, root / "shipped")
    return config, root


@pytest.fixture
def quick_shipped(tmp_path, quick_build):
    """The quick shipped folder, copied for one test to change."""
    config, root = quick_build
    shutil.copytree(root / "shipped", tmp_path / "shipped")
    return config, tmp_path / "shipped"


def test_a_rebuild_is_compared_by_weights_and_held_out_score_then_shipped(tmp_path, quick_build):
    config, root = quick_build
    comparison, _ = base_rebuild.rebuild(root / "build", root / "shipped", config)
    assert comparison.same_weights and comparison.matches and "bit for bit" in comparison.describe()
    shipped_base.check_files(root / "shipped")
    run = tmp_path / "run"
    assert shipped_base.restore(quick_config(run), shipped_base.rows_for(config, run), run, root / "shipped")


def test_a_build_folder_made_by_other_code_is_built_again(tmp_path, quick_build):
    config, root = quick_build
    build = tmp_path / "build"
    shutil.copytree(root / "build", build)
    (build / "base_model" / "model.safetensors").write_bytes(b"not what this code builds")
    (build / "recipe.txt").write_text("an older recipe\n")
    comparison, _ = base_rebuild.rebuild(build, root / "shipped", quick_config(build))
    assert comparison.same_weights  # built again from nothing, on the same machine: the same bits


def test_shipping_over_a_shipped_model_replaces_it(quick_build, quick_shipped):
    config, root = quick_build
    _, folder = quick_shipped
    (folder / "base_model" / "model.safetensors").write_bytes(b"an older model")
    _, manifest = base_rebuild.rebuild(root / "build", folder, config)
    base_rebuild.ship(root / "build" / "base_model", manifest, folder)
    assert shipped_base.check_files(folder) == manifest
    assert sorted(p.name for p in folder.parent.iterdir()) == ["shipped"]  # nothing staged or retired is left


def test_a_rebuild_of_another_float_path_matches_within_the_tolerance():
    near = base_rebuild.Comparison(False, 0.105, 0.100)
    far = base_rebuild.Comparison(False, 0.125, 0.100)
    assert near.matches and "matches" in near.describe()
    assert not far.matches and "DOES NOT MATCH" in far.describe()
    zen4, zen3 = "AMD EPYC, ATen AVX512", "AMD EPYC, ATen AVX2"  # one model name for both under KVM
    elsewhere = base_rebuild.Comparison(False, 0.3136, 0.2209, zen4, zen3)
    assert not elsewhere.matches
    assert f"shipped from {zen4}, rebuilt on {zen3}" in elsewhere.describe()
    assert "On another float path this is expected" in elsewhere.describe()
    same_path = base_rebuild.Comparison(False, 0.3136, 0.2209, zen4, zen4)
    assert "expected" not in same_path.describe()  # on the builder's float path a mismatch is a defect


def test_the_float_path_tells_cpus_of_one_model_name_apart(monkeypatch):
    import torch

    assert Manifest.read(SHIPPED).float_path == "AMD EPYC, ATen AVX512"  # the Zen 4 of 2026-11-25 (avx512_bf16)
    capability = torch.backends.cpu.get_cpu_capability()
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    assert base_rebuild.float_path().endswith(f", ATen {capability}")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")  # a cap on MKL changes a matmul's bits
    assert base_rebuild.float_path().endswith(f", ATen {capability}, MKL AVX2")
    assert base_rebuild._built_on(1.0)["float_path"] == base_rebuild.float_path()


def test_tampered_weights_and_a_changed_recipe_are_named(tmp_path, quick_shipped):
    _, folder = quick_shipped
    weights = folder / "base_model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ShippedBaseError, match="model.safetensors has sha256"):
        shipped_base.check_files(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest |= {"weights_sha256": shipped_base.file_sha256(weights), "recipe": "0" * 16}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VerlSearchError, match=r"make base-model UPDATE=1"):
        shipped_base.check_files(folder)


def test_a_tokenizer_learnt_otherwise_is_not_restored(tmp_path, quick_shipped, caplog):
    config, folder = quick_shipped
    manifest = json.loads((folder / "manifest.json").read_text()) | {"tokenizer": "another"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert not shipped_base.restore(quick_config(run), shipped_base.rows_for(config, run), run, folder)
    assert "tokenizer" in caplog.text and not (run / "base_model").exists()


def test_edited_build_code_or_damaged_weights_are_not_restored(tmp_path, quick_shipped, caplog, monkeypatch):
    config, folder = quick_shipped
    run = tmp_path / "run"
    rows = shipped_base.rows_for(config, run)
    with caplog.at_level(logging.WARNING), monkeypatch.context() as patched:
        patched.setattr(shipped_base, "recipe_digest", lambda: "an edited pretrain.py")
        assert not shipped_base.restore(quick_config(run), rows, run, folder)
    assert "code that builds the base model changed" in caplog.text
    weights = folder / "base_model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a checkout cut short
    with caplog.at_level(logging.WARNING):
        assert not shipped_base.restore(quick_config(run), rows, run, folder)
    assert "weights are not the manifest's" in caplog.text and not (run / "base_model").exists()


def test_an_unreadable_manifest_is_a_clear_error(tmp_path):
    shutil.copytree(SHIPPED / "base_model", tmp_path / "base_model")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ShippedBaseError, match="cannot read the shipped base model's manifest"):
        Manifest.read(tmp_path)


def test_the_recipe_digest_ignores_docstrings_and_comments_but_not_code():
    plain = shipped_base._source_without_docs("def f(x):\n    return x + 1\n")
    documented = shipped_base._source_without_docs('def f(x):\n    """Add one."""\n    # really\n    return x + 1\n')
    changed = shipped_base._source_without_docs("def f(x):\n    return x + 2\n")
    assert plain == documented != changed


@pytest.mark.slow
def test_make_base_model_rebuilds_what_is_shipped(tmp_path, capsys):
    """The full rebuild (10-17 minutes on 2 cores). On the float path that built the shipped one (CPU model, torch's
    instruction set, MKL's cap): the same bits, else the held-out score within the tolerance. On another float path
    training can end at another model: the Zen 4-built model's held-out loss came out 6.8% apart rebuilt on a Zen 3
    (a match), 15-42% on the 2-core Intel Xeon (two float paths; docs/results/training.md), so there a mismatch is an
    expected failure, reported with its figures, until the recipe or the tolerance is settled by measurement."""
    code = base_rebuild.main(["--out", str(tmp_path)])
    verdict = capsys.readouterr().out.strip()
    builder, here = Manifest.read(SHIPPED).float_path, base_rebuild.float_path()
    if code and here != builder:
        pytest.xfail(f"rebuilt on {here!r}, shipped from {builder!r}: {verdict}")
    assert code == 0, verdict
