"""Every refusal: a one-line cause naming the file/row/column, a non-zero exit code, and no output file written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def assert_refused(result, *fragments: str, code: int = 1) -> None:
    exit_code, _, stderr = result
    assert exit_code == code, stderr
    for fragment in fragments:
        assert fragment in stderr, stderr


def no_files(directory) -> bool:
    return not directory.exists() or not any(directory.iterdir())


@pytest.mark.parametrize("column", ["question", "golden_answers", "data_source"])
def test_missing_column_is_named(column, search_r1_dir, tmp_path, run_cli, write_split):
    rows = write_split(search_r1_dir / "test.parquet", "test", {"nq": 2})
    for row in rows:
        del row[column]
    import pandas as pd

    pd.DataFrame(rows).to_parquet(search_r1_dir / "test.parquet")
    out = tmp_path / "out"
    assert_refused(
        run_cli("--input_dir", search_r1_dir, "--local_dir", out), "test.parquet", f"missing column(s) {column}"
    )
    assert no_files(out)  # train.parquet was valid, but nothing is written when any split fails


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("golden_answers", [], "row 1: column golden_answers is empty"),
        ("golden_answers", ["", "  "], "row 1: column golden_answers is empty"),
        ("golden_answers", None, "row 1: column golden_answers is missing"),
        ("question", "   ", "row 1: column question is empty"),
        ("question", None, "row 1: column question is missing"),
        ("data_source", "", "row 1: column data_source is empty"),
    ],
)
def test_bad_row_is_named(field, value, message, tmp_path, run_cli, write_split, write_rows):
    rows = write_split(tmp_path / "in" / "test.parquet", "test", {"nq": 3})
    rows[1][field] = value
    write_rows(rows, tmp_path / "in" / "test.parquet")
    out = tmp_path / "out"
    assert_refused(run_cli("--input_dir", tmp_path / "in", "--local_dir", out, "--splits", "test"), message)
    assert no_files(out)


def test_failed_run_leaves_previous_outputs_untouched(search_r1_dir, tmp_path, run_cli, write_rows):
    out = tmp_path / "out"
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_rows([{"question": "q", "golden_answers": [], "data_source": "nq"}], search_r1_dir / "test.parquet")
    assert_refused(run_cli("--input_dir", search_r1_dir, "--local_dir", out), "golden_answers is empty")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files left, nothing replaced


def test_missing_split_file(tmp_path, run_cli, write_split):
    write_split(tmp_path / "in" / "train.parquet", "train", {"nq": 2})
    out = tmp_path / "out"
    assert_refused(run_cli("--input_dir", tmp_path / "in", "--local_dir", out), "input file not found", "test.parquet")
    assert no_files(out)


def test_unreadable_parquet(tmp_path, run_cli):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "test.parquet").write_text("not parquet")
    assert_refused(run_cli("--input_dir", tmp_path / "in", "--local_dir", tmp_path / "o", "--splits", "test"),
                   "cannot read parquet file")  # fmt: skip


def test_empty_split(tmp_path, run_cli, write_rows):
    import pandas as pd

    path = tmp_path / "in" / "test.parquet"
    path.parent.mkdir()
    pd.DataFrame({"question": [], "golden_answers": [], "data_source": []}).to_parquet(path)
    assert_refused(
        run_cli("--input_dir", tmp_path / "in", "--local_dir", tmp_path / "o", "--splits", "test"), "no rows"
    )


def test_unknown_template(search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "out"
    assert_refused(run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--template", "chatml"),
                   "unknown template 'chatml'", "search_r1", "tool_call")  # fmt: skip
    assert no_files(out)


def test_invalid_template_file(search_r1_dir, tmp_path, run_cli):
    bad = tmp_path / "prompt.yaml"
    bad.write_text("default: t\ntemplates:\n  t:\n    description: d\n    agent_name: tool_agent\n    user: no slot\n")
    assert_refused(run_cli("--config", bad, "--input_dir", search_r1_dir, "--local_dir", tmp_path / "o"),
                   str(bad), "templates.t", "{question}")  # fmt: skip
    assert no_files(tmp_path / "o")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "golden_answers": ["a"], "data_source": "nq"}\n{not json\n', "toy.jsonl:2: not valid JSON"),
        ('["q", ["a"]]\n', "toy.jsonl:1: expected a JSON object"),
        ('{"question": "q", "data_source": "nq"}\n', "toy.jsonl:1: missing column(s) golden_answers"),
        ('{"question": "q", "golden_answers": ["a"]}\n', "toy.jsonl:1: row has no data_source; pass --data_source"),
        ('{"question": "q", "golden_answers": [""], "data_source": "nq"}\n', "toy.jsonl:1: column golden_answers"),
        ('{"question": "q", "golden_answers": [["a"]], "data_source": "nq"}\n', "must hold strings, got list"),
        ('{"question": "q", "golden_answers": {"a": 1}, "data_source": "nq"}\n', "must be a list of strings"),
        ('{"question": 3, "golden_answers": ["a"], "data_source": "nq"}\n', "question must be a string, got int"),
        ("\n\n", "toy.jsonl: no rows"),
    ],
    ids=["bad-json", "not-object", "missing-answers", "no-source", "empty-answer", "nested", "dict", "int", "empty"],
)
def test_bad_jsonl(content, message, tmp_path, run_cli):
    path = tmp_path / "toy.jsonl"
    path.write_text(content)
    assert_refused(run_cli("--input_jsonl", path, "--local_dir", tmp_path / "o"), message)
    assert no_files(tmp_path / "o")


def test_missing_jsonl(tmp_path, run_cli):
    assert_refused(run_cli("--input_jsonl", tmp_path / "nope.jsonl", "--local_dir", tmp_path / "o"), "not found")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--splits", "train", "--val_per_source", "5"], "test is not among the splits"),
        (["--data_source", "nq"], "data_source applies only to input_jsonl"),
        (["--val_per_source", "-1"], "val_per_source: Input should be greater than or equal to 0"),
        (["--splits", "test", "test"], "splits listed twice"),
        (["--hf_revision", "main"], "hf_revision applies only to hub input"),
    ],
)
def test_inconsistent_flags_are_usage_errors(args, message, search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "o"
    assert_refused(run_cli("--input_dir", search_r1_dir, "--local_dir", out, *args), message, code=2)
    assert no_files(out)


def test_two_inputs_are_a_usage_error(tmp_path, run_cli, toy_jsonl, search_r1_dir):
    assert_refused(run_cli("--input_dir", search_r1_dir, "--input_jsonl", toy_jsonl), "not allowed with", code=2)


def test_offline_hub_download_fails_clearly(tmp_path, repo_root):
    """Default input (the hub dataset) with the hub unreachable: a one-line cause and exit 1, no traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = [sys.executable, "data_preprocess/preprocess_searchR1_dataset.py", "--local_dir", str(tmp_path / "o"),
           "--no_progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: cannot download train.parquet from hub dataset")
    assert "PeterJinGo/nq_hotpotqa_train" in done.stderr and "--input_dir" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()
