"""The evaluation's knobs are declared once (verl_search.launch.eval_run), CHECKPOINT is resolved once, and the script
gives verl exactly the knobs' overrides before the engine, attention, search and trainer parts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from verl_search.launch.checks import read_data_file
from verl_search.launch.eval_run import (
    EvalRunKnobs,
    data_notes,
    gpu_eval_overrides,
    missing_data_hint,
    validation_overrides,
)

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "run_scripts" / "eval_search.sh"


def _overrides(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_on_gpus_it_evaluates_the_recipes_model_on_the_validation_subset_greedily(tmp_path):
    knobs = EvalRunKnobs.from_env({"DATA_DIR": "/d", "RUN_DIR": str(tmp_path)})
    values = _overrides(gpu_eval_overrides(knobs))
    assert values["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-3B-Instruct" and knobs.rollout == "sglang"
    assert values["data.val_files"] == values["data.train_files"] == "/d/val_subset.parquet"
    assert values["data.train_max_samples"] == values["data.train_batch_size"] == "64"
    assert values["trainer.val_only"] == "True" and values["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "False"
    assert values["trainer.validation_data_dir"] == f"{tmp_path}/generations"
    assert values["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in values
    assert knobs.experiment_name == "eval-Qwen2.5-3B-Instruct-tool_agent"


def test_on_a_cpu_it_needs_a_model_and_adds_only_the_evaluations_overrides(tmp_path):
    with pytest.raises(match="set MODEL_PATH to a model folder"):
        EvalRunKnobs.from_env({"DEVICE": "cpu"})
    knobs = EvalRunKnobs.from_env({"DEVICE": "cpu", "MODEL_PATH": "/m/sft", "VAL_DATA": "/d/eval.parquet"})
    assert knobs.rollout == "vllm" and knobs.train_batch_size == 4
    values = _overrides(validation_overrides(knobs))
    assert "actor_rollout_ref.model.path" not in values  # run_tiny_search_cpu.sh's knobs carry the model
    assert values["data.train_max_samples"] == "4" and knobs.train_data == knobs.val_data == "/d/eval.parquet"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEVICE": "tpu"}, "DEVICE=tpu: choose cuda or cpu"),
        ({"DEVICE": "cpu", "ROLLOUT": "sglang"}, "ROLLOUT=sglang: SGLang has no CPU build"),
        ({"DEVICE": "cpu", "ROLLOUT": "trt"}, "ROLLOUT=trt: on a CPU choose vllm or hf_cpu"),
        ({"ROLLOUT": "hf_cpu"}, "ROLLOUT=hf_cpu: on GPUs choose sglang or vllm"),
        ({"GPU_MEMORY_UTILIZATION": "2"}, "GPU_MEMORY_UTILIZATION=2: Input should be less than or equal to 1"),
        ({"CHECKPOINT": "/no/such/run"}, "CHECKPOINT=/no/such/run: no such folder"),
    ],
)
def test_a_bad_knob_is_named(env, message):
    with pytest.raises(match=message):
        EvalRunKnobs.from_env(env)


def test_a_checkpoint_folder_means_its_latest_step_and_a_model_folder_is_the_model(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "global_step_7" / "actor").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("7\n")
    knobs = EvalRunKnobs.from_env({"CHECKPOINT": str(checkpoints), "MODEL_PATH": "/base"})
    values = _overrides(gpu_eval_overrides(knobs))
    assert values["trainer.resume_mode"] == "resume_path"
    assert values["trainer.resume_from_path"] == f"{checkpoints}/global_step_7"
    assert values["actor_rollout_ref.model.path"] == "/base"  # the actor is loaded on top of the base model
    assert knobs.experiment_name == "eval-checkpoints-tool_agent"

    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    knobs = EvalRunKnobs.from_env({"CHECKPOINT": str(merged), "RESUME_MODE": "resume_path"})
    assert knobs.model_path == str(merged) and knobs.resume_mode == "disable" and not knobs.resume_from

    (tmp_path / "junk").mkdir()
    with pytest.raises(match="neither a verl checkpoint"):
        EvalRunKnobs.from_env({"CHECKPOINT": str(tmp_path / "junk")})


def test_the_script_gives_verl_the_knobs_overrides_then_its_own_parts_then_the_users(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHON": sys.executable, "DRY_RUN": "1", "SKIP_PREFLIGHT": "1", "RUN_DIR": str(tmp_path / "r")}
    env |= {"ROLLOUT": "vllm", "N_GPUS": "2"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "trainer.nnodes=2"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0].splitlines()[1:]
    printed = [shlex.split(line.strip().rstrip("\\"))[0] for line in printed]  # printed shell-quoted
    expected = gpu_eval_overrides(EvalRunKnobs.from_env(env))
    assert printed[: len(expected)] == expected
    assert "actor_rollout_ref.rollout.name=vllm" in printed[len(expected) :]
    assert printed[-1] == "trainer.nnodes=2"


def _parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"i": pa.array(range(rows), pa.int32())}), path)
    return path


def test_full_test_means_the_test_split_and_an_explicit_val_data_still_wins():
    knobs = EvalRunKnobs.from_env({"DATA_DIR": "/d", "FULL_TEST": "1"})
    assert knobs.full_test and knobs.val_data == knobs.train_data == "/d/test.parquet"
    knobs = EvalRunKnobs.from_env({"DATA_DIR": "/d", "FULL_TEST": "1", "VAL_DATA": "/e/mine.parquet"})
    assert knobs.val_data == "/e/mine.parquet"
    assert data_notes(knobs) == ["eval: FULL_TEST=1, but VAL_DATA=/e/mine.parquet is set and is what gets evaluated"]
    with pytest.raises(match="FULL_TEST=maybe: choose 1"):
        EvalRunKnobs.from_env({"FULL_TEST": "maybe"})


def test_the_full_test_set_gets_its_rows_and_the_recipes_time_per_pass(tmp_path):
    published = _parquet(tmp_path / "all.parquet", 51_713)
    (note,) = data_notes(EvalRunKnobs.from_env({"VAL_DATA": str(published)}))
    assert note == (
        f"eval: evaluating the full test set {published}: 51,713 rows, about 6,000 s (1.7 h) per validation pass "
        "(the published recipe's ~6,000 s per 51,713-row pass on 8xH20); DATA_DIR/val_subset.parquet (the default "
        "VAL_DATA, at most 500 rows per source) is the quick check"
    )
    _parquet(tmp_path / "test.parquet", 5_171)
    (note,) = data_notes(EvalRunKnobs.from_env({"DATA_DIR": str(tmp_path), "FULL_TEST": "1"}))
    assert f"{tmp_path}/test.parquet: 5,171 rows, about 600 s per validation pass" in note
    assert "8xH20, scaled by rows)" in note
    _parquet(tmp_path / "val_subset.parquet", 3_125)
    assert data_notes(EvalRunKnobs.from_env({"DATA_DIR": str(tmp_path)})) == []  # the subset needs no warning


def test_a_missing_subset_names_the_command_that_makes_it_and_the_full_test_set(tmp_path):
    data = tmp_path / "data"
    hint = missing_data_hint(EvalRunKnobs.from_env({"DATA_DIR": str(data)}))
    assert hint == (
        f"eval: VAL_DATA={data}/val_subset.parquet does not exist; make it with `cd {REPO} && python "
        "data_preprocess/preprocess_searchR1_dataset.py --config data_preprocess/prompt.yaml "
        f"--local_dir {data}` (train, test and val_subset.parquet), or evaluate the full test set with FULL_TEST=1 "
        "(DATA_DIR/test.parquet)"
    )
    native = missing_data_hint(EvalRunKnobs.from_env({"DATA_DIR": str(data), "AGENT": "search_r1_agent"}))
    assert f"--local_dir {data} --template search_r1`" in native
    assert missing_data_hint(EvalRunKnobs.from_env({"VAL_DATA": str(tmp_path / "mine.parquet")})) is None
    _parquet(data / "val_subset.parquet", 4)
    assert missing_data_hint(EvalRunKnobs.from_env({"DATA_DIR": str(data)})) is None


def test_a_data_file_rewritten_in_place_is_read_again(tmp_path):
    path = _parquet(tmp_path / "val_subset.parquet", 3)
    assert read_data_file(str(path)).rows == 3
    _parquet(path, 7)
    assert read_data_file(str(path)).rows == 7
