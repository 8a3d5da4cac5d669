"""Fixtures for the preprocessing tests: small Search-R1-schema parquet splits, a toy jsonl, the CLI, a tokenizer."""

from __future__ import annotations

import json
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
    from verl_search.local_tokenizer import load_tokenizer

    return load_tokenizer(tmp_path_factory.mktemp("tokenizer"))
