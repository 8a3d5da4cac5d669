"""SIGTERM or SIGINT stops a server in each start-up phase that can take minutes on a real corpus: downloading the
encoder from the hub, building the BM25 index, encoding the embedded default's index, loading a faiss index and
pre-scanning a torch one. The server exits 0
within seconds, says it stopped during start-up, and leaves nothing behind that a restart would take as complete.

Each phase is made long enough to be caught in the middle: the hub is a stub on 127.0.0.1 that trickles the weights,
and the indexes are sparse files of 2M rows (gigabytes to read, nothing on disk)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "local_dense_retriever" / "retrieval_server.py"
#: far longer than a stop takes, far shorter than the phase it interrupts would take to finish
STOP_BOUND_S = 20.0
ROWS, DIM = 2_000_000, 384


def _minilm() -> Path:
    from local_dense_retriever.toy.embedded_default import bundled_minilm_path

    return bundled_minilm_path()


def _write_corpus(path: Path, rows: int) -> Path:
    rng = np.random.default_rng(0)
    words = rng.integers(0, 5000, size=(rows, 60))
    with open(path, "w") as f:
        for i in range(rows):
            text = " ".join(f"w{j}" for j in words[i])
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\n{text}'}) + "\n")
    return path


def _sparse_npy(path: Path) -> Path:
    """A float32 .npy of ROWS x DIM zeros that takes no disk space."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (ROWS, DIM)})
        f.truncate(f.tell() + ROWS * DIM * 4)
    return path


def _sparse_faiss(path: Path) -> Path:
    """A faiss IndexFlatIP of ROWS x DIM zeros that takes no disk space: a one-row index's header, its row counts
    (``ntotal`` and the vector array's float count) rewritten, the file extended to the rows it now claims."""
    import faiss

    one = faiss.IndexFlatIP(DIM)
    one.add(np.zeros((1, DIM), dtype="float32"))
    data = bytearray(faiss.serialize_index(one).tobytes())
    head = len(data) - DIM * 4
    data[8:16] = struct.pack("<q", ROWS)
    data[head - 8 : head] = struct.pack("<Q", ROWS * DIM)
    with open(path, "wb") as f:
        f.write(data[:head])
        f.truncate(head + ROWS * DIM * 4)
    return path


class _TrickleHub(http.server.BaseHTTPRequestHandler):
    """The hub's file routes for one repo, served from a local model folder; the weights come 64 KiB per 0.5 s."""

    folder: Path
    commit = "0123456789abcdef0123456789abcdef01234567"

    def log_message(self, *args) -> None:
        pass

    def _file(self) -> Path | None:
        m = re.fullmatch(r"/org/minilm/resolve/[^/]+/(.+)", self.path.split("?")[0])
        path = self.folder / m.group(1) if m else None
        return path if path is not None and path.is_file() else None

    def _head(self, path: Path | None) -> None:
        if path is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", self.commit)
        self.send_header("ETag", f'"{path.name}-{path.stat().st_size}"')
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head(self._file())

    def do_GET(self) -> None:
        path = self._file()
        self._head(path)
        if path is None:
            return
        slow = path.suffix == ".safetensors"
        try:
            with open(path, "rb") as f:
                while chunk := f.read(64 << 10 if slow else 1 << 20):
                    self.wfile.write(chunk)
                    if slow:
                        time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def hub() -> Iterator[str]:
    handler = type("Hub", (_TrickleHub,), {"folder": _minilm()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _percent_at_least(what: str, percent: int) -> Callable[[str], bool]:
    pattern = re.compile(rf"loading {re.escape(what)}: .* \((\d+)%\)")
    return lambda log: any(int(p) >= percent for p in pattern.findall(log))


def _stop_in_phase(
    tmp_path: Path, args: list[str], reached: Callable[[str], bool], sig: int, *, settle_s: float = 0.0, env=None
) -> str:
    """Start the server, signal it ``settle_s`` after ``reached(log)``, and return its log after it exited 0 within
    the bound."""
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args, "--port", "0", "--num_threads", "1", "--load_progress_s", "0.2"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not reached(log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        time.sleep(settle_s)
        assert proc.poll() is None, log.read_text(errors="replace")
        proc.send_signal(sig)
        assert proc.wait(STOP_BOUND_S) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert "stopped during start-up" in text, text
    assert "ready:" not in text, "the phase ended before the signal came: make it longer"
    return text


def test_a_signal_during_the_encoder_download_leaves_no_complete_weights(tmp_path, hub):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", 100)
    home = tmp_path / "hf"
    text = _stop_in_phase(
        tmp_path,
        ["--corpus_path", str(corpus), "--index_path", str(_sparse_npy(tmp_path / "index.npy")),
         "--retriever_model", "org/minilm", "--retriever_name", "minilm", "--backend", "torch"],
        lambda log: "loading encoder (org/minilm" in log and any((home / "hub").rglob("*.incomplete")),
        signal.SIGTERM,
        env={"HF_ENDPOINT": hub, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"},
    )  # fmt: skip
    assert "loaded encoder" not in text
    assert not list((home / "hub").rglob("snapshots/*/model.safetensors")), "a partial download looks complete"


def test_a_signal_while_bm25_is_built_leaves_no_bm25_index(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", 40_000)
    text = _stop_in_phase(
        tmp_path, ["--corpus_path", str(corpus), "--backend", "bm25"],
        lambda log: "building bm25 index" in log, signal.SIGINT, settle_s=1.0,
    )  # fmt: skip
    assert "loaded bm25 index" not in text
    assert not (tmp_path / "corpus.jsonl.bm25").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_embedded_default_is_encoded_leaves_no_complete_index(tmp_path, sig):
    _stop_in_phase(
        tmp_path, ["--toy_passages", "20000", "--cache_dir", str(tmp_path / "cache")],
        lambda log: "building the embedded default index" in log, sig, settle_s=3.0,
    )  # fmt: skip
    folder = tmp_path / "cache" / "toy-20000"
    assert not (folder / "minilm_flat.npy").exists() and not (folder / "minilm_flat.npy.source.json").exists()


def test_a_signal_while_a_faiss_index_loads_stops_the_load(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus.jsonl", 100)
    before = sorted(p.name for p in tmp_path.iterdir())
    text = _stop_in_phase(
        tmp_path,
        ["--corpus_path", str(corpus), "--index_path", str(_sparse_faiss(tmp_path / "big.faiss")),
         "--retriever_model", str(_minilm()), "--retriever_name", "minilm", "--backend", "faiss"],
        _percent_at_least("faiss index", 12), signal.SIGTERM,
    )  # fmt: skip
    assert "loaded faiss index" not in text
    written = set(p.name for p in tmp_path.iterdir()) - set(before) - {"server.log", "big.faiss"}
    assert written <= {"corpus.jsonl.offsets.npy"}, written


def test_a_signal_during_the_torch_pre_scan_copy_stops_the_load(tmp_path):
    from local_dense_retriever.accel.rule import auto_copy
    from local_dense_retriever.config import cpu_flags

    copy = auto_copy(cpu_flags())
    if copy is None:
        pytest.skip("this CPU has no fast pre-scan copy (no AVX512-BF16, AMX or VNNI)")
    corpus = _write_corpus(tmp_path / "corpus.jsonl", 100)
    before = sorted(p.name for p in tmp_path.iterdir())
    # the stage counts the file's bytes, then as many again for the copy: past 55% the copy is being built
    text = _stop_in_phase(
        tmp_path,
        ["--corpus_path", str(corpus), "--index_path", str(_sparse_npy(tmp_path / "big.npy")),
         "--retriever_model", str(_minilm()), "--retriever_name", "minilm", "--backend", "torch",
         "--index_prefilter", copy],
        _percent_at_least("torch index", 55), signal.SIGINT,
    )  # fmt: skip
    assert "loaded torch index" not in text
    written = set(p.name for p in tmp_path.iterdir()) - set(before) - {"server.log", "big.npy"}
    assert written <= {"corpus.jsonl.offsets.npy"}, written
