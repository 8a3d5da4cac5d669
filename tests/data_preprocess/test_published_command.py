"""The published command, as users type it: ``--config prompt.yaml`` from data_preprocess/ or the repo root, and the
validation subset the training script's default VAL_DATA reads, written without being asked for."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "data_preprocess" / "preprocess_searchR1_dataset.py"
PROMPT_YAML = REPO_ROOT / "data_preprocess" / "prompt.yaml"


def run_script(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """The real script in a fresh interpreter, from ``cwd``, named by its absolute path."""
    cmd = [sys.executable, str(SCRIPT), *map(str, args), "--no_progress"]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def sources(path: Path) -> dict[str, int]:
    return dict(Counter(pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()))


def test_config_prompt_yaml_resolves_from_the_repo_root(search_r1_dir, tmp_path, repo_root):
    """The folder's own name works from the root too (``--config data_preprocess/prompt.yaml`` always did)."""
    out = tmp_path / "out"
    done = run_script(repo_root, "--config", "prompt.yaml", "--input_dir", search_r1_dir, "--local_dir", out)
    assert done.returncode == 0, done.stderr
    assert (out / "test.parquet").is_file()


def test_published_command_from_data_preprocess(search_r1_dir, tmp_path, repo_root):
    """``cd data_preprocess && python preprocess_searchR1_dataset.py --config prompt.yaml``, word for word."""
    out = tmp_path / "out"
    cmd = [sys.executable, "preprocess_searchR1_dataset.py", "--config", "prompt.yaml",
           "--input_dir", str(search_r1_dir), "--local_dir", str(out), "--no_progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo_root / "data_preprocess", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet", "val_subset.parquet"]


def test_a_config_in_the_working_directory_wins_and_the_scripts_folder_is_the_fallback(search_r1_dir, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    done = run_script(cwd, "--config", "prompt.yaml", "--input_dir", search_r1_dir, "--local_dir", tmp_path / "a")
    assert done.returncode == 0, done.stderr  # no prompt.yaml here: the script's own
    assert pq.read_table(tmp_path / "a" / "test.parquet").column("agent_name").to_pylist()[0] == "tool_agent"

    own = yaml.safe_load(PROMPT_YAML.read_text()) | {"default": "search_r1"}
    (cwd / "prompt.yaml").write_text(yaml.safe_dump(own))
    done = run_script(cwd, "--config", "prompt.yaml", "--input_dir", search_r1_dir, "--local_dir", tmp_path / "b")
    assert done.returncode == 0, done.stderr  # the working directory's, whose default is search_r1
    assert pq.read_table(tmp_path / "b" / "test.parquet").column("agent_name").to_pylist()[0] == "search_r1_agent"


def test_a_config_found_nowhere_names_every_place_looked(search_r1_dir, tmp_path, repo_root):
    out = tmp_path / "out"
    done = run_script(tmp_path, "--config", "mine/prompt.yaml", "--input_dir", search_r1_dir, "--local_dir", out)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: template file mine/prompt.yaml not found (looked for {tmp_path}/mine/prompt.yaml, "
        f"{repo_root}/data_preprocess/mine/prompt.yaml)"
    )
    assert not out.exists()


def test_the_validation_subset_is_written_by_default_with_500_rows_per_source(tmp_path, repo_root, write_split):
    write_split(tmp_path / "in" / "train.parquet", "train", {"nq": 2})
    write_split(tmp_path / "in" / "test.parquet", "test", {"nq": 520, "hotpotqa": 500, "bamboogle": 3})
    out = tmp_path / "out"
    done = run_script(repo_root, "--input_dir", tmp_path / "in", "--local_dir", out)
    assert done.returncode == 0, done.stderr
    capped = {"searchR1_nq": 500, "searchR1_hotpotqa": 500, "searchR1_bamboogle": 3}
    assert sources(out / "val_subset.parquet") == capped
    assert sources(out / "test.parquet")["searchR1_nq"] == 520  # the subset is of the test split, which stays whole
    assert f"{out / 'val_subset.parquet'}  (val_subset, 1003 rows)" in done.stdout


def test_val_per_source_0_writes_no_subset_and_says_so(search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "out"
    code, stdout, _ = run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--val_per_source", "0")
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert "no val_subset.parquet written (--val_per_source 0)" in stdout


def test_a_subset_left_by_an_earlier_run_is_named_when_none_is_written(search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out)[0] == 0
    before = (out / "val_subset.parquet").read_bytes()
    code, stdout, _ = run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--val_per_source", "0")
    assert code == 0 and (out / "val_subset.parquet").read_bytes() == before
    assert f"the {out / 'val_subset.parquet'} already there is from an earlier run, left unchanged" in stdout


def test_train_only_runs_need_no_flag_for_the_default_subset(search_r1_dir, tmp_path, run_cli):
    """The default subset applies when the test split is written; a train-only run is not refused for it."""
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--splits", "train")
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet"]
    assert "val_subset" not in stdout
