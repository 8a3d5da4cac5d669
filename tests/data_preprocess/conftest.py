"""Fixtures for the preprocessing tests: Search-R1-schema parquet splits, a toy jsonl, the CLI, a tokenizer, a hub."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from verl_search.data.cli import main as cli_main

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT_YAML = REPO_ROOT / "data_preprocess" / "prompt.yaml"
SCRIPT = REPO_ROOT / "data_preprocess" / "preprocess_searchR1_dataset.py"

TEST_SOURCES = {"nq": 7, "hotpotqa": 5, "bamboogle": 2}


def search_r1_row(split: str, index: int, source: str, question: str, answers: list[str]) -> dict:
    """One row exactly as the Search-R1 parquet files hold it (DESIGN §3.5)."""
    return {
        "id": f"{split}_{index}",
        "question": question,
        "golden_answers": answers,
        "data_source": source,
        "prompt": [{"content": f"old Search-R1 prompt for: {question}", "role": "user"}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": answers}, "style": "rule"},
        "extra_info": {"index": index, "split": split},
        "metadata": {"note": f"{source}-{index}"},
    }


def build_split(split: str, sources: dict[str, int]) -> list[dict]:
    rows = []
    for source, count in sources.items():
        for k in range(count):
            index = len(rows)
            rows.append(search_r1_row(split, index, source, f"{source} question number {k}", [f"{source} answer {k}"]))
    return rows


def write_parquet(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def test_sources() -> dict[str, int]:
    """Rows per data source in the test split of ``search_r1_dir``."""
    return dict(TEST_SOURCES)


@pytest.fixture
def write_split():
    """``write_split(path, split, {source: rows})`` writes a Search-R1-schema parquet file; returns the rows."""

    def write(path: Path, split: str, sources: dict[str, int]) -> list[dict]:
        rows = build_split(split, sources)
        write_parquet(rows, path)
        return rows

    return write


@pytest.fixture
def write_rows():
    """``write_rows(path, rows)`` writes arbitrary rows to parquet through pandas."""
    return write_parquet


@pytest.fixture
def search_r1_dir(tmp_path: Path) -> Path:
    """A directory with train.parquet (nq+hotpotqa) and test.parquet (nq, hotpotqa, bamboogle) in Search-R1's schema."""
    directory = tmp_path / "search_r1"
    write_parquet(build_split("train", {"nq": 4, "hotpotqa": 3}), directory / "train.parquet")
    write_parquet(build_split("test", TEST_SOURCES), directory / "test.parquet")
    return directory


@pytest.fixture
def toy_jsonl(tmp_path: Path) -> Path:
    """A FlashRAG-style QA file like the demo's toy set (id, question, golden_answers, data_source, metadata)."""
    path = tmp_path / "toy_qa.jsonl"
    rows = [
        {"id": f"toy-{i}", "question": f"Where is landmark {i}", "golden_answers": [f"City {i}", f"C{i}"],
         "data_source": "toy", "metadata": {"doc_id": str(i)}}
        for i in range(6)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process like the script does; returns (exit code, stdout, stderr), usage errors included."""

    def run(*args: str | Path) -> tuple[int, str, str]:
        try:
            code = cli_main([str(a) for a in args] + ["--no_progress"], default_config=PROMPT_YAML)
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory):
    """The locally trained Qwen2.5-style tokenizer (chat template with tools, hermes markup)."""
    from cpu_bench.train.local_tokenizer import load_tokenizer

    return load_tokenizer(tmp_path_factory.mktemp("tokenizer"))


class _HubHandler(BaseHTTPRequestHandler):
    """Answers ``/datasets/{repo}/resolve/{rev}/{file}`` like the Hugging Face hub (HEAD + GET, 404 otherwise)."""

    files: dict[str, Path] = {}

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _answer(self, with_body: bool) -> None:
        repo_and_name = self.path.split("/resolve/", 1)
        name = repo_and_name[-1].split("/", 1)[-1]
        path = self.files.get(name)
        if len(repo_and_name) != 2 or path is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.end_headers()
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if with_body:
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(with_body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(with_body=True)


@pytest.fixture
def fake_hub(search_r1_dir):
    """A local stand-in for the hub serving ``search_r1_dir``'s parquet files; yields its endpoint URL."""
    handler = type("Handler", (_HubHandler,), {"files": {p.name: p for p in search_r1_dir.glob("*.parquet")}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()
