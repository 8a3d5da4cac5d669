"""Hub input (the default): downloaded through huggingface_hub from a local stand-in of the hub."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_search.data.errors import SourceUnavailable
from verl_search.data.pipeline import download_split


def test_cli_downloads_from_the_hub_and_matches_local_input(fake_hub, search_r1_dir, tmp_path, repo_root, run_cli):
    """HF_ENDPOINT (a mirror) is honoured; the result equals preprocessing the same files from --input_dir."""
    env = {**os.environ, "HF_ENDPOINT": fake_hub, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    cmd = [sys.executable, "data_preprocess/preprocess_searchR1_dataset.py", "--local_dir", str(tmp_path / "hub"),
           "--no_progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", tmp_path / "local")[0] == 0
    for name in ("train.parquet", "test.parquet"):
        assert (tmp_path / "hub" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


def test_download_split_caches_the_file(fake_hub, search_r1_dir, tmp_path):
    path = download_split("PeterJinGo/nq_hotpotqa_train", "test", cache_dir=tmp_path, endpoint=fake_hub)
    assert path.read_bytes() == (search_r1_dir / "test.parquet").read_bytes()
    assert tmp_path in path.parents


def test_missing_file_on_the_hub_is_named(fake_hub, tmp_path):
    with pytest.raises(SourceUnavailable, match="hub dataset some/repo has no file val.parquet"):
        download_split("some/repo", "val", cache_dir=tmp_path, endpoint=fake_hub)
