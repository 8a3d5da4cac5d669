"""Fixtures for the launch-script tests: a real /retrieve server on 127.0.0.1, small data in the verl-search schema,
and a runner for the real scripts in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from fastapi import FastAPI

from verl_search.background_server import BackgroundServer
from verl_search.protocol import RetrieveRequest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "run_scripts"
QUESTIONS = [("who wrote hamlet?", "William Shakespeare"), ("capital of france?", "Paris")] * 4


def retrieval_app() -> FastAPI:
    """A tiny retriever speaking DESIGN §3.1: every query gets ``topk`` made-up wiki-18-shaped passages."""
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict:
        topk = request.topk or 3
        result = []
        for query in request.queries:
            docs = [{"id": str(i), "contents": f'"{query}"\nPassage {i} about {query}.'} for i in range(topk)]
            result.append([{"document": d, "score": 1.0} for d in docs] if request.return_scores else docs)
        return {"result": result}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


@pytest.fixture(scope="session")
def retriever_url() -> str:
    with BackgroundServer(retrieval_app()) as server:
        yield server.url


@pytest.fixture(scope="session")
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/retrieve"


def write_rows(path: Path, agent_name: str = "tool_agent", n: int = len(QUESTIONS)) -> Path:
    """Rows in the DESIGN §3.5 schema, as data_preprocess writes them."""
    rows = []
    for i, (question, answer) in enumerate((QUESTIONS * (n // len(QUESTIONS) + 1))[:n]):
        ground_truth = {"target": [answer]}
        rows.append(
            {
                "data_source": "searchR1_nq",
                "prompt": [{"role": "user", "content": f"Answer the question: {question}"}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": ground_truth},
                "extra_info": {
                    "index": i,
                    "split": "test",
                    "question": question,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ground_truth}}},
                },
                "agent_name": agent_name,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """``train.parquet``, ``val_subset.parquet`` and ``test.parquet`` with 8 rows each."""
    root = tmp_path_factory.mktemp("data")
    for name in ("train.parquet", "val_subset.parquet", "test.parquet"):
        write_rows(root / name)
    return root


@pytest.fixture(scope="session")
def run_script(tmp_path_factory) -> Callable[..., subprocess.CompletedProcess]:
    """Run ``run_scripts/NAME`` with bash from a fresh directory (not the checkout) with extra env vars."""

    def run(name: str, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
        cwd = tmp_path_factory.mktemp("cwd")
        full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
        full_env.update({"PYTHON": sys.executable, "WANDB_MODE": "disabled"}, **env)
        return subprocess.run(
            ["bash", str(SCRIPTS / name), *args],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


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
