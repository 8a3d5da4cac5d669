"""Shared fixtures: a tiny hashing encoder (API tests), small toy corpora and their MiniLM index (built once).

Imports of the service stack stay inside fixtures so GPU-only tests also run where fastapi/pydantic are absent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # effective only if torch is not imported yet (see the CLI)

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

TOY_PASSAGES = 300
SERVER_SCRIPT = (
    Path(__file__).resolve().parents[2] / "local_dense_retriever" / "retrieval_server.py"
)  # MiniLM encodes this in well under a minute on 2 shared cores


class HashEncoder:
    """Fake encoder for tests where the model is not the point: bag of hashed words, L2-normalised."""

    dim = 16384
    device = torch.device("cpu")

    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor:
        out = torch.zeros(len(texts), self.dim)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return torch.nn.functional.normalize(out + 1e-6, dim=-1)


class SteerableBackend:
    """A search backend the test steers: each call waits until ``release`` is set (at most ``wait_s``), then raises
    ``error`` if one is set, else answers from the wrapped backend."""

    def __init__(self, inner, wait_s: float = 30.0) -> None:
        self.inner = inner
        self.wait_s = wait_s
        self.release = threading.Event()
        self.error: Exception | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def describe(self) -> str:
        return "steerable"

    def search(self, queries, k):
        self.release.wait(self.wait_s)
        if self.error is not None:
            raise self.error
        return self.inner.search(queries, k)


@pytest.fixture(scope="session")
def steerable_backend() -> type[SteerableBackend]:
    return SteerableBackend


def write_corpus(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": str(i), "contents": f'"Doc {i}"\n{text}'}) + "\n")
    return path


def hash_engine(corpus_path: Path):
    """An engine with the hashing encoder and a torch flat index over ``corpus_path``."""
    from local_dense_retriever.corpus_store import CorpusStore
    from local_dense_retriever.engine import RetrievalEngine
    from local_dense_retriever.index.base import DenseSearch
    from local_dense_retriever.index.torch_flat import TorchFlatIndex
    from local_dense_retriever.pages import CorpusPages

    corpus = CorpusStore(corpus_path, progress=False)
    enc = HashEncoder()
    vectors = enc.encode([corpus.get(i)["contents"] for i in range(len(corpus))], is_query=False).numpy()
    index = TorchFlatIndex(vectors, device=torch.device("cpu"))
    return RetrievalEngine(DenseSearch(enc, index), corpus, corpus_pages=CorpusPages(corpus, progress=False))


ANIMALS = ["aardvark", "badger", "camel", "dingo", "emu", "ferret", "gecko", "heron", "ibis", "jackal"]


@pytest.fixture(scope="session")
def animal_corpus(tmp_path_factory) -> Path:
    """50 passages; passage i names animal i % 10 and the number word 'item{i}'."""
    texts = [f"The {ANIMALS[i % 10]} number item{i} lives here." for i in range(50)]
    return write_corpus(tmp_path_factory.mktemp("animals") / "corpus.jsonl", texts)


@pytest.fixture(scope="session")
def hash_encoder_cls() -> type[HashEncoder]:
    return HashEncoder


@pytest.fixture(scope="session")
def make_hash_engine():
    """Factory: corpus path → engine with the hashing encoder and a torch flat index."""
    return hash_engine


@pytest.fixture(scope="session")
def make_corpus():
    """Factory: (path, texts) → corpus jsonl with rows {id, contents}."""
    return write_corpus


@pytest.fixture(scope="session")
def toy_dataset(tmp_path_factory):
    from local_dense_retriever.toy.corpus import generate_toy_dataset

    return generate_toy_dataset(tmp_path_factory.mktemp("toy"), num_passages=TOY_PASSAGES, seed=0)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from local_dense_retriever.toy.embedded_default import bundled_minilm_path

    return bundled_minilm_path()


def tiny_cross_encoder(folder: Path, minilm_path: Path, num_labels: int = 1, **config) -> None:
    """A 2-layer, 32-wide BERT cross-encoder with MiniLM's tokenizer, saved to ``folder``."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=tokenizer.vocab_size, num_labels=num_labels, initializer_range=0.5, **shape, **config)
    )  # a wide initialisation, so passages get clearly different scores
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="session")
def make_cross_encoder(minilm_path):
    """Factory: folder (, num_labels, BertConfig overrides) -> a tiny cross-encoder saved there (the rerank stage's
    tests, on any backend)."""
    return functools.partial(tiny_cross_encoder, minilm_path=minilm_path)


@pytest.fixture(scope="session")
def minilm_encoder(minilm_path):
    from local_dense_retriever.encoder import HFEncoder

    # float32 whatever the CPU, so the shared index and the quality thresholds do not depend on the start-up probe
    return HFEncoder(minilm_path, retriever_name="minilm", pooling="mean", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def minilm_index(toy_dataset, minilm_encoder) -> dict[str, Path]:
    """The toy corpus encoded once with MiniLM, written both as .npy and as a faiss IndexFlatIP file."""
    from local_dense_retriever.artifacts.build_index import build_flat_index

    out = toy_dataset.corpus_path.parent
    paths = {"npy": out / "minilm.npy", "faiss": out / "minilm_Flat.index"}
    build_flat_index(
        toy_dataset.corpus_path,
        list(paths.values()),
        minilm_encoder,
        model_id="minilm",
        batch_size=32,
        shard_size=128,
        progress=False,
    )
    return paths


@pytest.fixture(scope="session")
def toy_questions(toy_dataset) -> list[dict]:
    return [json.loads(line) for line in toy_dataset.qa_path.read_text().splitlines()]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _start_cli_server(args: list[str], log: Path, script: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """The published command (or ``script``: a wrapper of it) on an ephemeral port of 127.0.0.1, read from its log;
    its output goes to ``log``. Returns the process and its URL once /health answers 200."""
    out = open(log, "w")  # noqa: SIM115 (owned by the process for its life)
    proc = subprocess.Popen(
        [sys.executable, *(script or [str(SERVER_SCRIPT)]), *args, "--port", "0", "--num_threads", "1"],
        stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    out.close()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
        if m := re.search(r"serving on (http://127\.0\.0\.1:\d+)", log.read_text()):
            url = m.group(1)
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"server never became ready: {log.read_text()}")


class WaitingProcess:
    """Python ``code`` in a second process (INFO logs on its stderr), started while this one holds the lock of a build
    and returned once it logs that it waits for that build: what a server starting beside a building one does."""

    def __init__(self, code: str, what: str) -> None:
        prelude = "import logging, sys\nlogging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        self.proc = subprocess.Popen([sys.executable, "-c", prelude + code], **pipes)
        self.log = ""
        while f"waiting for another process building {what}" not in self.log:
            line = self.proc.stderr.readline()
            assert line, f"the second process did not wait: {self.log}"
            self.log += line

    def finish(self) -> str:
        """Its stdout once it has ended, successfully; ``self.log`` then holds its whole stderr."""
        out, err = self.proc.communicate(timeout=300)
        self.log += err
        assert self.proc.returncode == 0, self.log
        return out


_RSS_PROBE = """
import sys, torch
from pathlib import Path
from local_dense_retriever.index.torch_flat import TorchFlatIndex, index_source


def peak():  # this process's own high-water mark (getrusage's ru_maxrss starts at the parent's after fork and exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


path, copy, step = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
scan = None
if copy != "off":
    from local_dense_retriever.accel.prescan import Prescan
    from local_dense_retriever.accel.rule import COPIES

    scan = Prescan.wrapper(COPIES[copy], step_bytes=step)
before = peak()
index = TorchFlatIndex(index_source(path, torch.device("cpu"), "auto"), device=torch.device("cpu"), cpu_scan=scan)
print(len(index), peak() - before)
"""


@pytest.fixture(scope="session")
def big_flat_index(tmp_path_factory) -> Path:
    """A 200k x 384 faiss IndexFlatIP file (307 MB) of random rows."""
    import faiss

    index = faiss.IndexFlatIP(384)
    gen = np.random.default_rng(0)
    for _ in range(4):
        index.add(gen.standard_normal((50_000, 384), dtype=np.float32))
    path = tmp_path_factory.mktemp("big") / "big.index"
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="session")
def load_peak_rss():
    """Function: (index file, pre-scan copy or 'off', step bytes) -> (rows, bytes the peak RSS grew) of loading it
    with the torch backend on the CPU in a fresh process."""

    def run(path: Path, copy: str, step: int = 8 << 20) -> tuple[int, int]:
        command = [sys.executable, "-c", _RSS_PROBE, str(path), copy, str(step)]
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout.split()
        return int(out[0]), int(out[1])

    return run


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="session")
def start_cli_server():
    """Factory: (args, log path, script=None) -> (process, url) of the real server in its own process."""
    return _start_cli_server


@pytest.fixture(scope="session")
def waiting_process() -> type[WaitingProcess]:
    """Factory: (code, what) -> :class:`WaitingProcess` (the caller holds the lock of building ``what``)."""
    return WaitingProcess


@pytest.fixture(scope="session")
def cpu_seconds():
    """Function: pid -> CPU seconds the process has used."""
    return _cpu_seconds
