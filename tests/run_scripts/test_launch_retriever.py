"""run_scripts/launch_retriever.sh: starts the real retrieval server, waits for /health, prints RETRIEVER_URL."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time

import pytest
import requests

from cpu_bench.background_server import free_port
from verl_search.launch.tool_yaml import parse_urls

READY = re.compile(r"stop (?:it|them) with: kill ([\d ]+)\)")


def stop(output: str) -> None:
    match = READY.search(output)
    if match:
        for pid in match.group(1).split():
            os.kill(int(pid), signal.SIGTERM)


def free_port_pair() -> int:
    """A port P with P and P + 1 both free at the time of asking."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def test_missing_index_fails_before_starting_anything(run_script, tmp_path):
    result = run_script("launch_retriever.sh", DATA_DIR=str(tmp_path), PORT=str(free_port()))
    assert result.returncode == 1
    assert f"INDEX_PATH={tmp_path}/e5_Flat.index does not exist" in result.stderr
    assert "download.py --save_path" in result.stderr


def test_a_server_that_dies_at_start_up_is_reported_with_its_log(run_script, tmp_path):
    log = tmp_path / "retriever.log"
    result = run_script(
        "launch_retriever.sh", "--max_batch_size", "0", EMBEDDED="1", PORT=str(free_port()), LOG_FILE=str(log)
    )
    assert result.returncode == 1
    assert "the retriever exited during start-up" in result.stderr
    assert "max_batch_size" in result.stderr  # the server's own one-line cause, from the log tail
    with pytest.raises(ProcessLookupError):  # nothing left running
        os.kill(int((tmp_path / "retriever.log.pid").read_text()), 0)


def test_port_zero_is_refused(run_script):
    result = run_script("launch_retriever.sh", EMBEDDED="1", PORT="0")
    assert result.returncode == 1
    assert "PORT=0: give a fixed port number" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 2])
def test_embedded_retriever_serves_the_training_preflight(run_script, checked_run, small_env, tmp_path, servers):
    """launch_retriever.sh → its RETRIEVER_URL (one URL, or a list with SERVERS=2) → the training script's DRY_RUN
    passes against the real servers, every one of them probed (its preflight run in this process)."""
    port = free_port_pair()
    env = {
        "EMBEDDED": "1",
        "PORT": str(port),
        "SERVERS": str(servers),
        "LOG_FILE": str(tmp_path / "retriever.log"),
        "VERL_SEARCH_CACHE": str(tmp_path / "cache"),
    }
    result = run_script("launch_retriever.sh", "--toy_passages", "50", **env)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        last = result.stdout.strip().splitlines()[-1]
        urls = [f"http://127.0.0.1:{port + i}" for i in range(servers)]
        assert last == f"RETRIEVER_URL={','.join(urls)}"
        for url in urls:
            assert requests.get(f"{url}/health", timeout=5).status_code == 200
        train_env = small_env(tmp_path / "run")
        train_env["RETRIEVER_URL"] = last.split("=", 1)[1]
        train = checked_run("run_qwen2.5-3b_instruct_search_multiturn.sh", **train_env)
        assert train.returncode == 0, train.stdout + train.stderr
        for url in urls:
            assert f"OK      retriever: {url}/retrieve answered a probe" in train.stderr
    finally:
        stop(result.stdout)


def test_something_already_on_the_port_is_refused(run_script, retriever_url):
    port = retriever_url.rsplit(":", 1)[1]
    result = run_script("launch_retriever.sh", EMBEDDED="1", PORT=port)
    assert result.returncode == 1
    assert f"something already answers on 127.0.0.1:{port}" in result.stderr


def test_serve_fleet_with_no_ray_cluster_is_reported_with_its_cause(run_script, tmp_path):
    log = tmp_path / "retriever.log"
    result = run_script("launch_retriever.sh", SERVE="1", EMBEDDED="1", RAY_ADDRESS=f"127.0.0.1:{free_port()}",
                        PORT=str(free_port()), LOG_FILE=str(log))  # fmt: skip
    assert result.returncode == 1
    assert "the retriever exited during start-up" in result.stderr
    assert "no Ray cluster answers at 127.0.0.1:" in result.stderr


@pytest.mark.slow
def test_serve_fleet_starts_behind_one_url(run_script, tmp_path):
    """SERVE=1: two replicas in a local Ray instance, one URL printed; SIGTERM removes the application."""
    env = {"SERVE": "1", "EMBEDDED": "1", "REPLICAS": "2", "REPLICA_CPUS": "0.1", "PORT": str(free_port()),
           "LOG_FILE": str(tmp_path / "retriever.log"), "VERL_SEARCH_CACHE": str(tmp_path / "cache")}  # fmt: skip
    result = run_script("launch_retriever.sh", "--toy_passages", "50", timeout=400, **env)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        url = result.stdout.strip().splitlines()[-1].split("=", 1)[1]
        assert url == f"http://127.0.0.1:{env['PORT']}"
        body = {"queries": ["who"], "topk": 2}
        assert len(requests.post(f"{url}/retrieve", json=body, timeout=30).json()["result"][0]) == 2
    finally:
        stop(result.stdout)


def test_several_servers_start_behind_one_url_list(run_script, tmp_path):
    """SERVERS=2: two server processes on PORT and PORT + 1, each answering, their URLs in one RETRIEVER_URL list
    that the training script's tool config takes, a log per port, and one kill line that stops both."""
    port = free_port_pair()
    env = {"SERVERS": "2", "EMBEDDED": "1", "PORT": str(port), "LOG_FILE": str(tmp_path / "logs" / "ret.log"),
           "VERL_SEARCH_CACHE": str(tmp_path / "cache")}  # fmt: skip
    result = run_script("launch_retriever.sh", "--toy_passages", "50", **env)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        assert result.stdout.strip().splitlines()[-1] == f"RETRIEVER_URL={','.join(urls)}"
        assert parse_urls(",".join(urls)) == urls
        for url in urls:
            body = {"queries": ["who"], "topk": 2}
            assert len(requests.post(f"{url}/retrieve", json=body, timeout=30).json()["result"][0]) == 2
        for p in (port, port + 1):
            assert "serving on" in (tmp_path / "logs" / f"ret-{p}.log").read_text()
            assert f"\n  [port {p}] memory plan: minilm_flat.npy, " in result.stdout  # each server's loading shown
            assert f"\n  [port {p}] ready: " in result.stdout
        assert "the 2 retrievers are ready" in result.stdout
        threads = max(1, len(os.sched_getaffinity(0)) // 2)  # each its share of the cores
        assert result.stdout.count(f"--num_threads {threads} --port") == 2
    finally:
        stop(result.stdout)


def test_a_busy_port_among_the_servers_is_refused_before_starting_anything(run_script, retriever_url, tmp_path):
    busy = int(retriever_url.rsplit(":", 1)[1])
    log = tmp_path / "ret.log"
    result = run_script("launch_retriever.sh", SERVERS="2", EMBEDDED="1", PORT=str(busy - 1), LOG_FILE=str(log))
    assert result.returncode == 1
    assert f"something already answers on 127.0.0.1:{busy}" in result.stderr
    assert not list(tmp_path.glob("*.pid"))  # nothing was started


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SERVERS": "0"}, "SERVERS=0: give the number of server processes"),
        ({"SERVERS": "two"}, "SERVERS=two: give the number of server processes"),
        ({"SERVERS": "08"}, "SERVERS=08: give the number of server processes"),
        ({"SERVERS": "2", "SERVE": "1"}, "SERVERS=2 with SERVE=1: a Ray Serve fleet sizes itself with REPLICAS"),
        ({"SERVERS": "3", "PORT": "65534"}, "PORT=65534 SERVERS=3: the ports would pass 65535"),
        ({"PORT": "08"}, "PORT=08: give a fixed port number from 1 to 65535"),
        ({"PORT": "70000"}, "PORT=70000: give a fixed port number from 1 to 65535"),
    ],
)
def test_bad_ports_and_server_counts_are_refused(run_script, env, message):
    result = run_script("launch_retriever.sh", **{"EMBEDDED": "1", "PORT": str(free_port()), **env})
    assert result.returncode == 1
    assert message in result.stderr


def test_servers_that_die_at_start_up_leave_nothing_running_and_keep_the_given_threads(run_script, tmp_path):
    """A --num_threads given by the caller reaches every server as is; a server that exits during start-up is
    reported with its log, and no server of the group is left running."""
    port = free_port_pair()
    log = tmp_path / "ret.log"
    result = run_script("launch_retriever.sh", "--num_threads", "3", "--max_batch_size", "0", SERVERS="2",
                        EMBEDDED="1", PORT=str(port), LOG_FILE=str(log))  # fmt: skip
    assert result.returncode == 1
    assert result.stdout.count("--num_threads 3") == 2 and result.stdout.count("--num_threads") == 2
    assert "the retriever exited during start-up (port" in result.stderr
    assert "max_batch_size" in result.stderr
    for p in (port, port + 1):
        assert gone(int((tmp_path / f"ret-{p}.log.pid").read_text()))


def gone(pid: int, timeout: float = 15.0) -> bool:
    """Whether process ``pid`` no longer exists within ``timeout`` seconds (a stopped server may take a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_launcher_stopped_during_start_up_stops_every_server(start_script, tmp_path):
    """SIGTERM (or Ctrl-C) while the servers load: the launcher stops them all instead of leaving them loading."""
    port = free_port_pair()
    launcher = start_script("launch_retriever.sh", "--toy_passages", "50", SERVERS="2", EMBEDDED="1", PORT=str(port),
                            LOG_FILE=str(tmp_path / "ret.log"), VERL_SEARCH_CACHE=str(tmp_path / "cache"))  # fmt: skip
    pid_files = [tmp_path / f"ret-{p}.log.pid" for p in (port, port + 1)]
    deadline = time.monotonic() + 60
    while not all(f.is_file() and f.read_text().strip() for f in pid_files):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert "interrupted; stopped every retriever started" in err
    for f in pid_files:
        assert gone(int(f.read_text()))


def test_servers_not_ready_in_time_are_all_stopped(run_script, tmp_path):
    port = free_port_pair()
    result = run_script("launch_retriever.sh", "--toy_passages", "50", SERVERS="2", EMBEDDED="1", PORT=str(port),
                        LOG_FILE=str(tmp_path / "ret.log"), STARTUP_TIMEOUT="1", POLL_INTERVAL="0.2",
                        VERL_SEARCH_CACHE=str(tmp_path / "cache"))  # fmt: skip
    assert result.returncode == 1
    assert "error: the retriever was not ready after 1 s (port" in result.stderr
    assert "stopped every server started" in result.stderr
    for p in (port, port + 1):
        assert gone(int((tmp_path / f"ret-{p}.log.pid").read_text()))


def dry_run(run_script, **env: str) -> tuple[list[str], str]:
    """The server command lines DRY_RUN=1 prints (one per server), and the line naming the retriever's GPUs."""
    result = run_script("launch_retriever.sh", EMBEDDED="1", PORT=str(free_port()), DRY_RUN="1", **env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "DRY_RUN=1: not starting the retriever"
    commands = [lines[i + 1] for i, line in enumerate(lines) if line.startswith("the retriever on port ")]
    return commands, next(line for line in lines if line.startswith("retriever GPUs (GPUS="))


@pytest.mark.parametrize(
    ("env", "prefix", "flags", "note"),
    [
        ({}, "", "--device auto", "every visible GPU, else the CPU"),
        ({"GPUS": "none"}, "CUDA_VISIBLE_DEVICES= ", "--device cpu", "none, the CPU only"),
        ({"GPUS": "0,1"}, "CUDA_VISIBLE_DEVICES=0,1 ", "--device cuda", "CUDA_VISIBLE_DEVICES=0,1 for the server"),
        ({"GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "CUDA_VISIBLE_DEVICES=5,7 ", "--device cuda",
         "CUDA_VISIBLE_DEVICES=5,7 for the server"),
        ({"GPUS": "2", "DEVICE": "cuda:0"}, "CUDA_VISIBLE_DEVICES=2 ", "--device cuda:0", "CUDA_VISIBLE_DEVICES=2"),
        ({"GPUS": "0", "DEVICE": "cpu", "FAISS_GPU": "1"}, "CUDA_VISIBLE_DEVICES=0 ", "--device cpu --faiss_gpu",
         "CUDA_VISIBLE_DEVICES=0"),
        # the published ways of choosing GPUs, unchanged: the server inherits CUDA_VISIBLE_DEVICES
        ({"CUDA_VISIBLE_DEVICES": "7", "FAISS_GPU": "1"}, "", "--device auto --faiss_gpu",
         "every visible GPU (CUDA_VISIBLE_DEVICES=7), else the CPU"),
        ({"DEVICE": "cuda"}, "", "--device cuda", "every visible GPU"),
    ],
)  # fmt: skip
def test_gpus_choose_the_servers_visible_gpus_and_device(run_script, env, prefix, flags, note):
    """GPUS=all|none|0,1,... becomes the server's CUDA_VISIBLE_DEVICES (GPUS numbers the GPUs this shell sees) and
    its --device; the command printed is the one that runs."""
    commands, gpus = dry_run(run_script, SERVERS="2", **env)
    assert note in gpus
    assert len(commands) == 2
    for command in commands:
        assert (
            command.startswith(f"{prefix}{sys.executable} ") and "local_dense_retriever/retrieval_server.py" in command
        )
        assert f" {flags} " in command
        assert command.count("CUDA_VISIBLE_DEVICES") == (1 if prefix else 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUS": "two"}, "GPUS=two: give all, none or GPU numbers separated by commas (e.g. 0,1)"),
        ({"GPUS": "0,"}, "GPUS=0,: give all, none or GPU numbers"),
        ({"GPUS": "1,1"}, "GPUS=1,1: GPU 1 is named twice"),
        ({"GPUS": "2", "CUDA_VISIBLE_DEVICES": "4,5"},
         "GPUS=2: GPU 2 is not among the 2 that CUDA_VISIBLE_DEVICES=4,5 makes visible"),
        ({"GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}, "GPUS=0: GPU 0 is not among the 0 that CUDA_VISIBLE_DEVICES="),
        ({"GPUS": "none", "FAISS_GPU": "1"}, "FAISS_GPU=1 with GPUS=none"),
        ({"GPUS": "none", "DEVICE": "cuda"}, "DEVICE=cuda with GPUS=none: the server sees no GPU"),
        ({"GPUS": "0", "DEVICE": "cpu"}, "DEVICE=cpu with GPUS=0: nothing would use those GPUs"),
        ({"GPUS": "0", "SERVE": "1"}, "GPUS=0 with SERVE=1: Ray gives each replica its GPUs (REPLICA_GPUS)"),
    ],
)  # fmt: skip
def test_gpu_choices_that_cannot_work_are_refused(run_script, tmp_path, env, message):
    result = run_script("launch_retriever.sh", EMBEDDED="1", PORT=str(free_port()), LOG_FILE=str(tmp_path / "r.log"),
                        **env)  # fmt: skip
    assert result.returncode == 1
    assert message in result.stderr
    assert not list(tmp_path.glob("*.pid"))  # nothing was started


def test_the_wait_shows_the_loaders_lines_and_health_lists_no_gpus(run_script, tmp_path):
    """While the server loads, its memory plan, stages and progress counts are shown (not silence); the CPU server
    it starts (GPUS=none) reports no GPU in /health."""
    port = free_port()
    env = {"EMBEDDED": "1", "GPUS": "none", "PORT": str(port), "LOG_FILE": str(tmp_path / "r.log"),
           "VERL_SEARCH_CACHE": str(tmp_path / "cache")}  # fmt: skip
    args = ("--toy_passages", "50", "--index_dtype", "bfloat16", "--load_progress_s", "0")  # streamed: counted
    result = run_script("launch_retriever.sh", *args, **env)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        shown = [line for line in result.stdout.splitlines() if line.startswith("  ")]
        expected = [
            "  memory plan: minilm_flat.npy, 50 x 384 in bfloat16 on the CPU",
            "  memory plan: cpu: ",
            "  loading encoder (",
            "  loading torch index (minilm_flat.npy)",
            "  loading torch index: 75 of 75 KiB (100%), ",
            "  loaded torch index in ",
            "  ready: ",
        ]
        found = [next(i for i, line in enumerate(shown) if line.startswith(want)) for want in expected]
        assert found == sorted(found), shown  # in the order the server logged them
        health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["status"] == "ready" and health["gpus"] == []
    finally:
        stop(result.stdout)


def test_the_cpu_route_serves_a_compressed_index_built_from_the_downloaded_flat_one(run_script, tmp_path):
    """The README's option for a node whose GPUs all train: build IVF-SQ8 from the flat index, serve it with
    GPUS=none; what it serves is the IVF index, on the CPU, answering searches."""
    from local_dense_retriever.artifacts.build_index import main as build_index
    from local_dense_retriever.index.build_record import read_record
    from local_dense_retriever.toy.corpus import generate_toy_dataset
    from local_dense_retriever.toy.embedded_default import bundled_minilm_path

    data = tmp_path / "wiki-18"
    toy = generate_toy_dataset(data, num_passages=200, seed=0)
    model = ["--retriever_name", "minilm", "--retriever_model", str(bundled_minilm_path()), "--device", "cpu"]
    flat, ivf = data / "e5_Flat.index", data / "e5_ivf_sq8.index"
    assert (
        build_index(["--corpus_path", str(toy.corpus_path), "--output", str(flat), "--max_length", "64", *model]) == 0
    )
    assert build_index(["--from_index", str(flat), "--index_type", "ivf_sq8", "--output", str(ivf)]) == 0
    knobs = {"DATA_DIR": str(data), "INDEX_PATH": str(ivf), "CORPUS_PATH": str(toy.corpus_path), "GPUS": "none",
             "RETRIEVER_NAME": "minilm", "RETRIEVER_MODEL": str(bundled_minilm_path())}  # fmt: skip
    result = run_script("launch_retriever.sh", PORT=str(free_port()), LOG_FILE=str(tmp_path / "retriever.log"), **knobs)
    try:
        assert result.returncode == 0, result.stderr
        url = result.stdout.strip().splitlines()[-1].removeprefix("RETRIEVER_URL=")
        health = requests.get(url + "/health", timeout=10).json()
        assert health["passages"] == 200
        assert "IVF" in health["detail"] and "on cpu" in health["detail"]
        record = read_record(ivf)  # what the build measured is what /health reports, at the value it stored
        assert health["index"]["type"] == "ivf_sq8" and health["index"]["search_value"] == record.search_value
        assert health["index"]["recall"]["3"] == record.recall_at(record.search_value, 3)
        answer = requests.post(
            url + "/retrieve", json={"queries": ["Where was the river born?"], "topk": 3}, timeout=30
        )
        assert answer.status_code == 200 and len(answer.json()["result"][0]) == 3
    finally:
        stop(result.stdout)
