"""The one JSON-lines reader behind the preprocessing input (``data.pipeline``) and the validation dumps (``report``):
line numbers count blank lines, and a bad line raises the caller's own error naming the file and the line."""

from __future__ import annotations

import pytest

from verl_search.data.errors import InputSchemaError
from verl_search.data.pipeline import read_jsonl_rows
from verl_search.jsonl import read_jsonl
from verl_search.report import DumpError, read_dump


def test_values_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n   \n[2]\n"three"\n')
    assert list(read_jsonl(path, ValueError)) == [(1, {"a": 1}), (4, [2]), (5, "three")]


def test_each_caller_gets_its_own_error_with_the_same_message(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text('{"question": "q", "golden_answers": ["a"]}\n{not json\n')
    with pytest.raises(InputSchemaError, match=r"in\.jsonl:2: not valid JSON \("):
        read_jsonl_rows(data)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "3.jsonl").write_text('{"output": "o", "em": 1.0}\n\n{not json\n')
    with pytest.raises(DumpError, match=r"3\.jsonl:3: not valid JSON \("):
        read_dump(dumps)


def test_the_callers_checks_run_in_file_order(tmp_path):
    """A row of the wrong shape before a line that is not JSON is the error reported (the reader is lazy)."""
    data = tmp_path / "in.jsonl"
    data.write_text("[1]\n{not json\n")
    with pytest.raises(InputSchemaError, match=r"in\.jsonl:1: expected a JSON object, got list"):
        read_jsonl_rows(data)
