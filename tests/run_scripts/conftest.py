"""Fixtures for the launch-script tests: a real /retrieve server on 127.0.0.1, small data in the verl-search schema,
a runner for the real scripts in a subprocess, and a cheaper dry run that leaves the script's preflight to this
process (verl is imported and its config composed once per test process, not once per test)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from cpu_bench.background_server import free_port
from cpu_bench.testing.stub_retriever import StubServer
from verl_search.launch import preflight

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


def printed_overrides(stdout: str) -> list[str]:
    """The overrides of the ``command:`` a script printed (shell-quoted, one per line), as the shell reads them."""
    command = stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    words = shlex.split(command.replace("\\\n", " "))
    return words[words.index("verl.trainer.main_ppo") + 1 :]


@pytest.fixture(scope="session")
def overrides_of() -> Callable[[str], list[str]]:
    """:func:`printed_overrides`, for the test modules here (they cannot import this conftest)."""
    return printed_overrides


@dataclass(frozen=True)
class CheckedRun:
    """A script's dry run with its preflight skipped, then that preflight run here on the command the script printed.

    ``returncode`` is the script's when it stopped before printing a command, else the preflight's; ``stderr`` holds
    the script's lines, then the preflight's; ``overrides`` are the printed command's."""

    returncode: int
    stdout: str
    stderr: str
    overrides: tuple[str, ...]

    @property
    def command(self) -> str:
        return self.stdout.split("command:", 1)[1]


@pytest.fixture(scope="session")
def preflight_here() -> Callable[..., tuple[int, str]]:
    """``python -m verl_search.launch.preflight --dry-run --agent AGENT -- OVERRIDES`` as the scripts call it, in this
    process (AGENT: the overrides' default loop), with the environment a script gives it: no GPU selection, wandb off
    unless ``env`` says otherwise. Returns its exit status and its output."""

    def run(overrides: list[str], **env: str) -> tuple[int, str]:
        values = dict(o.split("=", 1) for o in overrides if "=" in o)
        argv = ["--dry-run", "--agent", values["actor_rollout_ref.rollout.agent.default_agent_loop"], "--", *overrides]
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"WANDB_MODE": "disabled", **env}), contextlib.redirect_stderr(out):
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            code = preflight.main(argv)
        return code, out.getvalue()

    return run


@pytest.fixture(scope="session")
def checked_run(run_script, preflight_here) -> Callable[..., CheckedRun]:
    """``run_script(NAME, ..., DRY_RUN=1, SKIP_PREFLIGHT=1)``, then the preflight it skipped (``preflight_here``) on the
    command it printed, with the environment the script was given."""

    def run(name: str, *args: str, **env: str) -> CheckedRun:
        script = run_script(name, *args, **{**env, "DRY_RUN": "1", "SKIP_PREFLIGHT": "1"})
        if script.returncode != 0:
            return CheckedRun(script.returncode, script.stdout, script.stderr, ())
        overrides = printed_overrides(script.stdout)
        code, out = preflight_here(overrides, **env)
        return CheckedRun(code, script.stdout, script.stderr + out, tuple(overrides))

    return run
