"""The published command, as users type it: ``--config prompt.yaml`` from data_preprocess/ or the repo root."""

from __future__ import annotations

import subprocess
import sys
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
    assert (out / "test.parquet").is_file()


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
