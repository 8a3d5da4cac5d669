"""SIGTERM and SIGINT stop a server that is still starting (here: encoding the embedded default's index) within
seconds, exit 0, and leave no index that looks complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "local_dense_retriever" / "retrieval_server.py"
#: far longer than a stop takes, far shorter than the encoding it interrupts
STOP_BOUND_S = 20.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_index_is_encoded_stops_the_server_and_leaves_no_complete_index(tmp_path, sig):
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--toy_passages", "20000", "--cache_dir", str(tmp_path / "cache"),
             "--port", "0", "--num_threads", "1"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "building the embedded default index" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(3)  # well into the encoding
        assert proc.poll() is None, log.read_text()
        proc.send_signal(sig)
        assert proc.wait(STOP_BOUND_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped during start-up" in log.read_text()
    folder = tmp_path / "cache" / "toy-20000"
    assert not (folder / "minilm_flat.npy").exists() and not (folder / "minilm_flat.npy.source.json").exists()
