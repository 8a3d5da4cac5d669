"""The protocol warm start behind the real-engine tests: what it trains on, and that it is built once per key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cpu_bench.testing.protocol_warm_start import WarmStartSpec, token_rows, trajectories, warm_start
from cpu_bench.train.data_stage import tool_schemas
from cpu_bench.train.sft_data import RowSettings
from cpu_bench.train.tiny_model import write_tiny_model
from verl_search.data.templates import load_templates

REPO = Path(__file__).resolve().parents[3]
RESULT = "Doc 1 (Title: Velmora) Velmora is a river town founded in 1821."
QUESTIONS = ("what is the capital of france (0)", "what is the capital of france (1)")
SPEC = WarmStartSpec(QUESTIONS, "capital of france", RESULT)


@pytest.fixture(scope="module")
def settings() -> RowSettings:
    templates = load_templates(REPO / "data_preprocess" / "prompt.yaml")
    schemas = tool_schemas(REPO / "tool_config" / "search_tool_config.yaml")
    return RowSettings(templates.get("tool_call")[1], templates.get("search_r1")[1], schemas)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_every_question_is_answered_with_every_answer():
    built = trajectories(SPEC)
    shown = {(q + "?", a) for q in SPEC.questions for a in ("Paris", "Lyon")}  # as the preprocessed rows show them
    assert {(t.question, t.answer) for t in built} == shown
    assert all(t.searches == ((SPEC.query, RESULT),) for t in built)
    with pytest.raises(ValueError, match="at least one question"):
        trajectories(replace(SPEC, answers=()))


def test_the_model_is_trained_on_its_own_turns_in_both_protocols_never_on_the_result(model, settings):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = token_rows(SPEC, settings, tokenizer)
    assert len(rows) == 2 * 2 * 2  # questions x answers x protocols
    trained = [tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) for ids, mask in rows]
    untrained = [tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m]) for ids, mask in rows]
    assert sum('"query_list": ["capital of france"]' in text for text in trained) == 4  # hermes
    assert sum("<search> capital of france </search>" in text for text in trained) == 4  # native
    assert all("<answer>" in text and "Velmora" not in text for text in trained)
    assert all("Velmora" in text for text in untrained)  # the result is shown, never trained on


def test_the_warm_start_is_built_once_per_key(model, settings, tmp_path):
    quick = replace(SPEC, steps=2)
    first = warm_start(model, quick, settings, tmp_path)
    assert (first / "config.json").is_file() and (first / "tokenizer.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert warm_start(model, quick, settings, tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not retrained
    assert warm_start(model, replace(quick, query="capital of spain"), settings, tmp_path) != first
