"""Preprocessing end to end through the CLI: what lands in the output files, for every option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_search.data.rows import OUTPUT_SCHEMA


def read_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_search_r1_parquet_becomes_verl_rows_routed_to_the_search_tool(search_r1_dir, test_sources, tmp_path, run_cli):
    out = tmp_path / "out"
    code, stdout, _ = run_cli("--input_dir", search_r1_dir, "--local_dir", out)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet", "val_subset.parquet"]
    assert pq.read_schema(out / "test.parquet").names == OUTPUT_SCHEMA.names

    test_rows = read_rows(out / "test.parquet")
    assert len(test_rows) == sum(test_sources.values())
    first = test_rows[0]
    question = "nq question number 0?"
    assert first["data_source"] == "searchR1_nq"
    assert first["agent_name"] == "tool_agent"
    assert first["ability"] == "fact-reasoning"
    assert first["reward_model"] == {"style": "rule", "ground_truth": {"target": ["nq answer 0"]}}
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    user = first["prompt"][1]["content"]
    assert user.endswith(f"Question: {question}")
    assert '{"name": "search", "arguments": {"query_list": [' in user and "<answer>" in user
    assert first["extra_info"] == {
        "index": 0,
        "split": "test",
        "id": "test_0",
        "question": question,
        "need_tools_kwargs": True,
        "tools_kwargs": {
            "search": {
                "create_kwargs": {
                    "ground_truth": {"target": ["nq answer 0"]},
                    "question": question,
                    "data_source": "searchR1_nq",
                }
            }
        },
    }
    assert [r["extra_info"]["index"] for r in test_rows] == list(range(len(test_rows)))
    assert {r["data_source"] for r in read_rows(out / "train.parquet")} == {"searchR1_nq", "searchR1_hotpotqa"}
    # the user is told where each file went and how many rows of each source it holds
    assert str(out / "test.parquet") in stdout and "searchR1_bamboogle" in stdout
    assert "searchR1_hotpotqa                       5" in stdout


def test_search_r1_template_routes_to_the_native_loop(search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--template", "search_r1")[0] == 0
    row = read_rows(out / "train.parquet")[0]
    assert row["agent_name"] == "search_r1_agent"
    assert [m["role"] for m in row["prompt"]] == ["user"]
    assert "<search> query </search>" in row["prompt"][0]["content"]
    assert "<information>" in row["prompt"][0]["content"]


def test_reruns_are_byte_identical(search_r1_dir, tmp_path, run_cli):
    args = ("--input_dir", search_r1_dir, "--val_per_source", "3", "--seed", "7")
    assert run_cli(*args, "--local_dir", tmp_path / "a")[0] == 0
    assert run_cli(*args, "--local_dir", tmp_path / "b")[0] == 0
    for name in ("train.parquet", "test.parquet", "val_subset.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_val_subset_is_stratified_and_seeded(search_r1_dir, tmp_path, run_cli):
    def subset(n: int, seed: int) -> list[dict]:
        out = tmp_path / f"n{n}-s{seed}"
        code, stdout, _ = run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--splits", "test",
                                  "--val_per_source", n, "--seed", seed)  # fmt: skip
        assert code == 0 and str(out / "val_subset.parquet") in stdout
        return read_rows(out / "val_subset.parquet")

    rows = subset(3, 0)
    counts = {}
    for row in rows:
        counts[row["data_source"]] = counts.get(row["data_source"], 0) + 1
    assert counts == {"searchR1_nq": 3, "searchR1_hotpotqa": 3, "searchR1_bamboogle": 2}  # all of a small source
    full = {r["extra_info"]["id"]: r for r in read_rows(tmp_path / "n3-s0" / "test.parquet")}
    assert all(full[r["extra_info"]["id"]] == r for r in rows)  # subset rows are the full test rows, unchanged
    ids = [r["extra_info"]["id"] for r in rows]
    assert ids == sorted(ids, key=lambda i: full[i]["extra_info"]["index"])  # kept in file order
    assert {r["extra_info"]["id"] for r in subset(3, 1)} != set(ids)  # the seed matters
    assert set(ids) <= {r["extra_info"]["id"] for r in subset(5, 0)}  # a bigger N extends, never reshuffles


def test_input_already_prefixed_is_not_prefixed_twice(tmp_path, run_cli, write_split):
    write_split(tmp_path / "in" / "test.parquet", "test", {"searchR1_nq": 2})
    assert run_cli("--input_dir", tmp_path / "in", "--local_dir", tmp_path / "out", "--splits", "test")[0] == 0
    assert {r["data_source"] for r in read_rows(tmp_path / "out" / "test.parquet")} == {"searchR1_nq"}


def test_missing_optional_columns_and_questions_without_question_mark(tmp_path, run_cli, write_rows):
    rows = [{"question": "  capital of france  ", "golden_answers": ["Paris"], "data_source": "nq"}]
    write_rows(rows, tmp_path / "in" / "test.parquet")
    assert run_cli("--input_dir", tmp_path / "in", "--local_dir", tmp_path / "out", "--splits", "test")[0] == 0
    row = read_rows(tmp_path / "out" / "test.parquet")[0]
    assert row["extra_info"]["question"] == "capital of france?"
    assert row["extra_info"]["id"] == "test_0" and row["ability"] == "fact-reasoning"


def test_toy_jsonl_becomes_test_and_val_files_in_one_command(toy_jsonl, tmp_path, run_cli):
    out = tmp_path / "toy"
    code, stdout, _ = run_cli("--input_jsonl", toy_jsonl, "--local_dir", out, "--val_per_source", "4")
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "val_subset.parquet"]
    rows = read_rows(out / "test.parquet")
    assert len(rows) == 6 and len(read_rows(out / "val_subset.parquet")) == 4
    assert rows[2]["data_source"] == "searchR1_toy"
    assert rows[2]["extra_info"]["id"] == "toy-2"
    assert rows[2]["reward_model"]["ground_truth"]["target"] == ["City 2", "C2"]
    assert "searchR1_toy" in stdout


def test_jsonl_to_train_and_test_with_a_default_source(tmp_path, run_cli):
    path = tmp_path / "flashrag.jsonl"
    path.write_text(
        json.dumps({"question": "q1", "golden_answers": ["a1"]}) + "\n\n"
        + json.dumps({"question": "q2", "golden_answers": ["a2"], "data_source": "popqa"}) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    out = tmp_path / "out"
    args = ("--input_jsonl", path, "--data_source", "nq", "--splits", "train", "test", "--local_dir", out)
    assert run_cli(*args)[0] == 0
    train, test = read_rows(out / "train.parquet"), read_rows(out / "test.parquet")
    assert [r["data_source"] for r in train] == ["searchR1_nq", "searchR1_popqa"]
    assert [r["extra_info"]["split"] for r in train] == ["train", "train"]
    assert [r["extra_info"]["split"] for r in test] == ["test", "test"]


def test_list_templates_names_each_with_its_agent(run_cli):
    code, stdout, _ = run_cli("--list_templates")
    assert code == 0
    assert "tool_call (default): agent_name=tool_agent" in stdout
    assert "search_r1: agent_name=search_r1_agent" in stdout


def test_script_runs_from_the_repo_root(search_r1_dir, tmp_path, repo_root):
    """The documented command, as a user types it, in a fresh interpreter."""
    out = tmp_path / "out"
    cmd = [sys.executable, "data_preprocess/preprocess_searchR1_dataset.py", "--config", "data_preprocess/prompt.yaml",
           "--input_dir", str(search_r1_dir), "--local_dir", str(out), "--splits", "test", "--no_progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "test.parquet").is_file()


@pytest.mark.parametrize("template", ["tool_call", "search_r1"])
def test_every_shipped_template_preprocesses(template, search_r1_dir, tmp_path, run_cli):
    out = tmp_path / template
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--template", template, "--splits", "test")[0] == 0
    assert read_rows(out / "test.parquet")[0]["agent_name"] in {"tool_agent", "search_r1_agent"}
