"""Fixtures for the CPU-trainer tests: a tiny random Qwen2, the real retriever (embedded toy default) on 127.0.0.1,
mixed tool_agent / search_r1_agent data, and a tool YAML whose results fit a 512-token response."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from verl_search.testing.background_server import free_port, wait_until_healthy

REPO = Path(__file__).resolve().parents[3]
# every row asks for the capital of France: the test-only forced answer ("Paris") is right wherever it is forced
QUESTIONS = [f"what is the capital of france ({i})" for i in range(8)]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from verl_search.train.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


@pytest.fixture(scope="session")
def real_retriever(tmp_path_factory):
    """The real retrieval service on the embedded toy default (60 passages, MiniLM), as a subprocess."""
    port = free_port()
    cache = tmp_path_factory.mktemp("retriever-cache")
    log = open(cache / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, str(REPO / "local_dense_retriever" / "retrieval_server.py"), "--port", str(port)]
        + ["--toy_passages", "60", "--cache_dir", str(cache)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=180, what="retriever")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _preprocess(out_dir: Path, template: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    qa = out_dir / "qa.jsonl"
    rows = [{"question": q, "golden_answers": ["Paris"], "data_source": "nq"} for q in QUESTIONS]
    qa.write_text("".join(json.dumps(row) + "\n" for row in rows))
    subprocess.run(
        [sys.executable, str(REPO / "data_preprocess" / "preprocess_searchR1_dataset.py"), "--input_jsonl", str(qa)]
        + ["--splits", "train", "test", "--val_per_source", "2", "--template", template]
        + ["--local_dir", str(out_dir), "--no_progress"],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return out_dir


@pytest.fixture(scope="session")
def mixed_data(tmp_path_factory) -> Path:
    """``train.parquet`` and ``val_subset.parquet`` whose rows alternate tool_agent and search_r1_agent."""
    root = tmp_path_factory.mktemp("data")
    hermes, native = _preprocess(root / "tool_call", "tool_call"), _preprocess(root / "search_r1", "search_r1")
    out = root / "mixed"
    out.mkdir()
    for split in ("train", "val_subset"):
        a, b = pd.read_parquet(hermes / f"{split}.parquet"), pd.read_parquet(native / f"{split}.parquet")
        rows = [frame.iloc[[i]] for i in range(min(len(a), len(b))) for frame in (a, b)]
        pd.concat(rows, ignore_index=True).to_parquet(out / f"{split}.parquet")
    return out


@pytest.fixture(scope="session")
def short_results_tool_yaml(tmp_path_factory) -> Path:
    """The shipped tool YAML with one passage per query, so a search result fits the tiny run's response budget."""
    config = yaml.safe_load((REPO / "tool_config" / "search_tool_config.yaml").read_text())
    config["tools"][0]["config"].update(topk=1, max_result_chars=800)
    path = tmp_path_factory.mktemp("tools") / "search_tool_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
