"""eval_search.sh's data: the validation subset by default, the full test set on request with its expected time, and
a missing subset explained before the preflight's "no such file" (the real script, DRY_RUN=1; past the default case
its preflight runs in this process)."""

from __future__ import annotations

import shutil

EVAL = "eval_search.sh"


def composed(result) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("command:", 1)[1]


def test_the_default_is_the_validation_subset(run_script, small_env, data_dir, tmp_path):
    """The evaluation as a GPU user dry-runs it, the preflight included (the other cases run it in this process)."""
    result = run_script(EVAL, **small_env(tmp_path / "eval"))
    command = composed(result)
    assert f"data.val_files={data_dir}/val_subset.parquet" in command
    assert "test.parquet" not in command
    assert "full test set" not in result.stdout + result.stderr
    assert "preflight: passed" in result.stderr and "DRY_RUN=1: checks passed; not launching" in result.stdout


def test_full_test_evaluates_test_parquet_and_says_how_long_a_pass_takes(checked_run, small_env, data_dir, tmp_path):
    result = checked_run(EVAL, FULL_TEST="1", **small_env(tmp_path / "eval"))
    assert f"data.val_files={data_dir}/test.parquet" in composed(result)
    assert (
        f"eval: evaluating the full test set {data_dir}/test.parquet: 16 rows, about 2 s per validation pass "
        "(the published recipe's ~6,000 s per 51,713-row pass on 8xH20, scaled by rows)"
    ) in result.stderr


def test_an_explicit_val_data_wins_over_full_test(checked_run, small_env, data_dir, tmp_path):
    env = small_env(tmp_path / "eval") | {"FULL_TEST": "1", "VAL_DATA": f"{data_dir}/val_subset.parquet"}
    result = checked_run(EVAL, **env)
    assert f"data.val_files={data_dir}/val_subset.parquet" in composed(result)
    assert f"eval: FULL_TEST=1, but VAL_DATA={data_dir}/val_subset.parquet is set" in result.stderr


def test_a_missing_subset_says_how_to_make_it_or_evaluate_the_full_test_set(checked_run, small_env, data_dir, tmp_path):
    only_test = tmp_path / "data"
    only_test.mkdir()
    shutil.copy(data_dir / "test.parquet", only_test / "test.parquet")
    result = checked_run(EVAL, **small_env(tmp_path / "eval") | {"DATA_DIR": str(only_test)})
    assert result.returncode == 1
    assert f"{only_test}/val_subset.parquet: no such file" in result.stderr
    hints = [line for line in result.stderr.splitlines() if line.startswith("eval: VAL_DATA=")]
    assert len(hints) == 1
    assert "python data_preprocess/preprocess_searchR1_dataset.py --config data_preprocess/prompt.yaml " in hints[0]
    assert f"--local_dir {only_test}`" in hints[0] and "FULL_TEST=1" in hints[0]
