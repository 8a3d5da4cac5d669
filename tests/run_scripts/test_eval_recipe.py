"""The evaluation script is its recipe: every knob is a ``${VAR:-default}`` in it, every override it prints is written
in it except the few Python adds (attention, trainer mode), the user's come last, CHECKPOINT is resolved in it, a bad
knob is named before anything is written; the data notes come from ``launch.eval_recipe``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_search.launch.eval_recipe import EvalKnobs, data_notes, missing_data_hint

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_scripts" / "eval_search.sh"
#: the overrides Python adds (the attention probe, the trainer mode)
DERIVED = (
    "+actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.model.use_remove_padding",
    "trainer.v1.",
)


def _dry_run(env: dict[str, str], cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")} | env
    env = {"DRY_RUN": "1", "SKIP_PREFLIGHT": "1", "WANDB_MODE": "disabled", **env, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *extra], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def _values(printed: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in printed)


def test_every_knob_has_its_default_in_the_script():
    text = SCRIPT.read_text()
    for name in EvalKnobs.model_fields:
        knob = name.upper()
        declared = rf'^\s*{knob}="(\$\(vs_\w+ )?"?\$\{{{knob}:-'
        assert re.search(declared, text, re.M) or re.search(rf'^{knob}="\$\w+"', text, re.M), knob


def test_every_printed_override_but_the_derived_ones_is_written_in_the_script(tmp_path, overrides_of):
    text = SCRIPT.read_text().replace('"$multi_turn"', "actor_rollout_ref.rollout.multi_turn")
    text = text.replace('"$actor"', "actor_rollout_ref.actor").replace('"$rollout"', "actor_rollout_ref.rollout")
    text = text.replace('"$val_kwargs"', "actor_rollout_ref.rollout.val_kwargs")
    for env in ({}, {"AGENT": "search_r1_agent", "TRAINER": "colocate_async"}):
        done = _dry_run({"RUN_DIR": str(tmp_path / "run"), **env}, tmp_path)
        assert done.returncode == 0, done.stderr
        printed = overrides_of(done.stdout)
        assert "actor_rollout_ref.rollout.skip_tokenizer_init=False" in printed or not env
        for override in printed:
            key = override.split("=", 1)[0]
            if not key.startswith(DERIVED):
                assert f"{key}=" in text, f"{override} is not written in the script"


def test_the_defaults_evaluate_the_recipes_model_on_the_validation_subset_greedily(tmp_path, overrides_of):
    done = _dry_run({"DATA_DIR": "/d", "RUN_DIR": "run"}, tmp_path)
    assert done.returncode == 0, done.stderr
    values = _values(overrides_of(done.stdout))
    assert values["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-3B-Instruct"
    assert values["actor_rollout_ref.rollout.name"] == "sglang"
    assert values["data.val_files"] == values["data.train_files"] == "/d/val_subset.parquet"
    assert values["data.train_max_samples"] == values["data.train_batch_size"] == "64"
    assert values["trainer.val_only"] == "True" and values["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "False"
    assert values["trainer.validation_data_dir"] == f"{tmp_path}/run/generations"
    assert values["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in values
    assert values["trainer.experiment_name"] == "eval-Qwen2.5-3B-Instruct-tool_agent"
    assert values["trainer.logger"] == '["console"]'


def test_the_users_overrides_come_last_after_what_python_adds(tmp_path, overrides_of):
    env = {"TRAINER": "colocate_async", "RUN_DIR": str(tmp_path / "r"), "ROLLOUT": "vllm"}
    done = _dry_run(env, tmp_path, "trainer.nnodes=2", "trainer.v1.trainer_mode=search_sync")
    assert done.returncode == 0, done.stderr
    printed = overrides_of(done.stdout)
    assert printed[-2:] == ["trainer.nnodes=2", "trainer.v1.trainer_mode=search_sync"]
    assert "trainer.v1.trainer_mode=search_colocate_async" in printed[:-2]
    assert "actor_rollout_ref.rollout.name=vllm" in printed
    assert (tmp_path / "r" / "search_tool_config.yaml").is_file()
    assert f"summarise them afterwards with: {sys.executable} -m verl_search.report {tmp_path}/r/generations" in (
        done.stdout
    )


def _checkpoints(root: Path, step: int, marker: str | None = None) -> Path:
    (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text(f"{step}\n" if marker is None else marker)
    return root


def test_a_checkpoint_folder_means_its_latest_step_on_top_of_model_path(tmp_path, overrides_of):
    checkpoints = _checkpoints(tmp_path / "checkpoints", 7)
    done = _dry_run({"CHECKPOINT": str(checkpoints), "MODEL_PATH": "/base", "RUN_DIR": "r"}, tmp_path)
    assert done.returncode == 0, done.stderr
    values = _values(overrides_of(done.stdout))
    assert values["trainer.resume_mode"] == "resume_path"
    assert values["trainer.resume_from_path"] == f"{checkpoints}/global_step_7"
    assert values["actor_rollout_ref.model.path"] == "/base"  # the actor is loaded on top of the base model
    assert values["trainer.experiment_name"] == "eval-checkpoints-tool_agent"


def test_a_marker_that_is_not_a_number_means_the_highest_step(tmp_path, overrides_of):
    checkpoints = _checkpoints(tmp_path / "checkpoints", 9, marker="soon")
    (checkpoints / "global_step_10" / "actor").mkdir(parents=True)
    done = _dry_run({"CHECKPOINT": str(checkpoints), "RUN_DIR": "r"}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert _values(overrides_of(done.stdout))["trainer.resume_from_path"] == f"{checkpoints}/global_step_10"


def test_a_step_folder_resumes_itself_and_a_model_folder_is_the_model(tmp_path, overrides_of):
    step = _checkpoints(tmp_path / "checkpoints", 3) / "global_step_3"
    done = _dry_run({"CHECKPOINT": str(step), "RUN_DIR": "r"}, tmp_path)
    assert _values(overrides_of(done.stdout))["trainer.resume_from_path"] == str(step)
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "config.json").write_text("{}")
    done = _dry_run({"CHECKPOINT": "merged", "RESUME_MODE": "resume_path", "RUN_DIR": "r"}, tmp_path)
    assert done.returncode == 0, done.stderr
    values = _values(overrides_of(done.stdout))
    assert values["actor_rollout_ref.model.path"] == str(merged)  # made absolute
    assert values["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in values
    assert values["trainer.experiment_name"] == "eval-merged-tool_agent"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEVICE": "tpu"}, "DEVICE=tpu: choose cuda or cpu"),
        ({"FULL_TEST": "maybe"}, "FULL_TEST=maybe: choose 1 (the full test set) or 0 (the subset)"),
        ({"CHECKPOINT": "/no/such/run"}, "CHECKPOINT=/no/such/run: no such folder"),
        ({"CHECKPOINT": "."}, "neither a verl checkpoint (no actor/) nor a Hugging Face model (no config.json)"),
        ({"DEVICE": "cpu", "ROLLOUT": "sglang", "MODEL_PATH": "/m"}, "ROLLOUT=sglang: SGLang has no CPU build"),
        ({"DEVICE": "cpu", "ROLLOUT": "trt", "MODEL_PATH": "/m"}, "ROLLOUT=trt: on a CPU choose vllm or hf_cpu"),
        ({"ROLLOUT": "hf_cpu"}, "ROLLOUT=hf_cpu: on GPUs choose sglang or vllm"),
        ({"DEVICE": "cpu"}, "set MODEL_PATH to a model folder, e.g. the one the checkpoint was trained from"),
        ({"GPU_MEMORY_UTILIZATION": "2"}, "GPU_MEMORY_UTILIZATION=2: Input should be less than or equal to 1"),
    ],
)
def test_a_bad_knob_is_named_before_anything_is_written(tmp_path, env, message):
    done = _dry_run({**env, "RUN_DIR": str(tmp_path / "run")}, tmp_path)
    assert done.returncode == 1
    assert message in done.stderr and "error: fix the knob named above" in done.stderr
    assert "command:" not in done.stdout and not (tmp_path / "run").exists()


def _knobs(**env: str) -> EvalKnobs:
    """The knobs as the script sets them by default on GPUs, with ``env`` over them."""
    defaults = {name.upper(): "1" for name in EvalKnobs.model_fields}
    defaults |= {"DEVICE": "cuda", "ROLLOUT": "sglang", "AGENT": "tool_agent", "FULL_TEST": "0", "DATA_DIR": "/d"}
    defaults |= {"GPU_MEMORY_UTILIZATION": "0.7", "MODEL_PATH": "m", "CHECKPOINT": ""}
    defaults["VAL_DATA"] = env.get("VAL_DATA") or f"{env.get('DATA_DIR', '/d')}/val_subset.parquet"
    return EvalKnobs.from_env(defaults | env)


def _parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"i": pa.array(range(rows), pa.int32())}), path)
    return path


def test_an_explicit_val_data_wins_over_full_test_and_says_so():
    knobs = _knobs(FULL_TEST="1", VAL_DATA="/e/mine.parquet")
    assert data_notes(knobs) == ["eval: FULL_TEST=1, but VAL_DATA=/e/mine.parquet is set and is what gets evaluated"]
    assert data_notes(_knobs(FULL_TEST="1", VAL_DATA="/d/test.parquet")) == []  # no such file: the preflight says


def test_full_test_in_the_script_means_the_test_split(tmp_path, overrides_of):
    done = _dry_run({"DATA_DIR": "/d", "FULL_TEST": "1", "RUN_DIR": "r"}, tmp_path)
    assert done.returncode == 0, done.stderr
    values = _values(overrides_of(done.stdout))
    assert values["data.val_files"] == values["data.train_files"] == "/d/test.parquet"


def test_the_full_test_set_gets_its_rows_and_the_recipes_time_per_pass(tmp_path):
    published = _parquet(tmp_path / "all.parquet", 51_713)
    (note,) = data_notes(_knobs(VAL_DATA=str(published)))
    assert note == (
        f"eval: evaluating the full test set {published}: 51,713 rows, about 6,000 s (1.7 h) per validation pass "
        "(the published recipe's ~6,000 s per 51,713-row pass on 8xH20); DATA_DIR/val_subset.parquet (the default "
        "VAL_DATA, at most 500 rows per source) is the quick check"
    )
    _parquet(tmp_path / "test.parquet", 5_171)
    (note,) = data_notes(_knobs(DATA_DIR=str(tmp_path), FULL_TEST="1", VAL_DATA=f"{tmp_path}/test.parquet"))
    assert f"{tmp_path}/test.parquet: 5,171 rows, about 600 s per validation pass" in note
    assert "8xH20, scaled by rows)" in note
    _parquet(tmp_path / "val_subset.parquet", 3_125)
    assert data_notes(_knobs(DATA_DIR=str(tmp_path))) == []  # the subset needs no warning


def test_a_missing_subset_names_the_command_that_makes_it_and_the_full_test_set(tmp_path):
    data = tmp_path / "data"
    hint = missing_data_hint(_knobs(DATA_DIR=str(data)))
    assert hint == (
        f"eval: VAL_DATA={data}/val_subset.parquet does not exist; make it with `cd {REPO} && python "
        "data_preprocess/preprocess_searchR1_dataset.py --config data_preprocess/prompt.yaml "
        f"--local_dir {data}` (train, test and val_subset.parquet), or evaluate the full test set with FULL_TEST=1 "
        "(DATA_DIR/test.parquet)"
    )
    native = missing_data_hint(_knobs(DATA_DIR=str(data), AGENT="search_r1_agent"))
    assert f"--local_dir {data} --template search_r1`" in native
    assert missing_data_hint(_knobs(VAL_DATA=str(tmp_path / "mine.parquet"))) is None
    _parquet(data / "val_subset.parquet", 4)
    assert missing_data_hint(_knobs(DATA_DIR=str(data))) is None


def test_on_a_cpu_the_notes_are_printed_and_the_cpu_script_gets_the_evaluations_overrides(tmp_path, overrides_of):
    env = {"DEVICE": "cpu", "ROLLOUT": "hf_cpu", "MODEL_PATH": "/m", "DATA_DIR": str(tmp_path / "none")}
    env["RUN_DIR"] = str(tmp_path / "r")
    done = _dry_run(env, tmp_path, "trainer.total_epochs=1")
    assert done.returncode == 0, done.stderr
    assert f"eval: VAL_DATA={tmp_path}/none/val_subset.parquet does not exist" in done.stderr
    assert "rollout engine:" not in done.stderr  # the GPU notes are not the CPU run's
    printed = overrides_of(done.stdout)
    assert printed[-1] == "trainer.total_epochs=1"
    values = _values(printed)
    assert values["data.max_prompt_length"] == "1024"  # run_tiny_search_cpu.sh's own default
    assert values["data.train_max_samples"] == "4" and values["actor_rollout_ref.rollout.name"] == "hf_cpu"
    assert printed.index("trainer.val_before_train=False") < printed.index("trainer.val_before_train=True")
