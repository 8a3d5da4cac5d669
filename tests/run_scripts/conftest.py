"""Fixtures for the launch-script tests: a real /retrieve server on 127.0.0.1, small data in the verl-search schema,
and a runner for the real scripts in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cpu_bench.background_server import free_port
from cpu_bench.testing.stub_retriever import StubServer

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "run_scripts"
QUESTIONS = [("who wrote hamlet", "William Shakespeare"), ("what is the capital of france", "Paris")] * 4


@pytest.fixture(scope="session")
def retriever_url() -> str:
    """A real /retrieve server on 127.0.0.1 (no corpus: every query gets made-up wiki-18-shaped passages)."""
    with StubServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/retrieve"


def preprocess(out_dir: Path, template: str) -> Path:
    """Run the real preprocessing script on a small FlashRAG-style jsonl; returns ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    qa = out_dir / "qa.jsonl"
    qa.write_text(
        "".join(
            json.dumps({"question": f"{q} ({i})", "golden_answers": [a], "data_source": source}) + "\n"
            for i, (q, a) in enumerate(QUESTIONS)
            for source in ("nq", "hotpotqa")
        )
    )
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data_preprocess" / "preprocess_searchR1_dataset.py"),
            "--input_jsonl",
            str(qa),
            "--splits",
            "train",
            "test",
            "--val_per_source",
            "2",
            "--template",
            template,
            "--local_dir",
            str(out_dir),
            "--no_progress",
        ],
        check=True,
        capture_output=True,
    )
    return out_dir


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """``train.parquet`` and ``test.parquet`` (16 rows) and ``val_subset.parquet`` (4 rows) for ``tool_agent``."""
    return preprocess(tmp_path_factory.mktemp("data"), "tool_call")


@pytest.fixture(scope="session")
def native_data_dir(tmp_path_factory) -> Path:
    """The same data with the Search-R1 native template (rows ask for ``search_r1_agent``)."""
    return preprocess(tmp_path_factory.mktemp("native-data"), "search_r1")


def script_call(name: str, args: tuple[str, ...], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line of ``run_scripts/NAME`` and the environment the tests run it with (this interpreter as
    PYTHON, no inherited PYTHONPATH or GPU selection, wandb off) plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    full_env.update({"PYTHON": sys.executable, "WANDB_MODE": "disabled"}, **env)
    return ["bash", str(SCRIPTS / name), *args], full_env


@pytest.fixture(scope="session")
def run_script(tmp_path_factory) -> Callable[..., subprocess.CompletedProcess]:
    """Run ``run_scripts/NAME`` with bash from a fresh directory (not the checkout) with extra env vars."""

    def run(name: str, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
        cmd, full_env = script_call(name, args, env)
        cwd = tmp_path_factory.mktemp("cwd")
        return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture(scope="session")
def start_script(tmp_path_factory) -> Callable[..., subprocess.Popen]:
    """``run_script`` without waiting: the script's process, its output piped, for tests that signal it."""

    def start(name: str, *args: str, **env: str) -> subprocess.Popen:
        cmd, full_env = script_call(name, args, env)
        cwd = tmp_path_factory.mktemp("cwd")
        return subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return start


@pytest.fixture(scope="session")
def small_env(data_dir, retriever_url) -> Callable[[Path], dict[str, str]]:
    """Knobs for a one-GPU dry run over the fixture data, writing into the given run folder."""

    def env(run_dir: Path) -> dict[str, str]:
        return {
            "DRY_RUN": "1",
            "DATA_DIR": str(data_dir),
            "RUN_DIR": str(run_dir),
            "RETRIEVER_URL": retriever_url,
            "N_GPUS": "1",
            "TRAIN_BATCH_SIZE": "4",
            "PPO_MINI_BATCH_SIZE": "4",
        }

    return env
