"""ROLLOUT=sglang|vllm in the real training script (DRY_RUN=1, a real local retriever, the preflight run in this
process): the engine override, the SGLang tokenizer setting the native loop needs, and the refusal of an unknown
engine."""

from __future__ import annotations

TRAIN = "run_qwen2.5-3b_instruct_search_multiturn.sh"


def command_of(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("command:", 1)[1]


def test_vllm_rollout_with_a_chosen_attention_passes_the_preflight(checked_run, small_env, tmp_path):
    result = checked_run(TRAIN, ROLLOUT="vllm", ATTN_IMPLEMENTATION="eager", **small_env(tmp_path / "run"))
    command = command_of(result)
    assert "actor_rollout_ref.rollout.name=vllm" in command
    assert "actor_rollout_ref.rollout.name=sglang" not in command
    assert "+actor_rollout_ref.model.override_config.attn_implementation=eager" in command
    assert "actor attention: eager, without padding removal (set by ATTN_IMPLEMENTATION)" in result.stderr
    assert "preflight: OK      attention: eager, padded batches" in result.stderr
    assert "preflight: OK      rollout engine: vllm (async)" in result.stderr
    assert "preflight: OK      stop strings:" in result.stderr


def test_native_loop_on_sglang_loads_sglangs_tokenizer(checked_run, small_env, native_data_dir, tmp_path):
    env = small_env(tmp_path / "run")
    env.update(DATA_DIR=str(native_data_dir), AGENT="search_r1_agent")
    result = checked_run(TRAIN, **env)
    command = command_of(result)
    assert "actor_rollout_ref.rollout.name=sglang" in command
    assert "actor_rollout_ref.rollout.skip_tokenizer_init=False" in command
    assert "preflight: OK      stop strings: search_r1_agent: sglang stops at </search> and </answer>" in result.stderr


def test_an_unknown_engine_is_refused_before_anything_is_written(run_script, small_env, tmp_path):
    result = run_script(TRAIN, ROLLOUT="sglang_async", **small_env(tmp_path / "run"))
    assert result.returncode == 1
    assert "ROLLOUT=sglang_async: choose sglang or vllm" in result.stderr
    assert not (tmp_path / "run").exists()
