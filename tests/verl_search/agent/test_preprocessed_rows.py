"""Rows made by our preprocessing (both prompt templates, read back from parquet) run through the agent loop each
names and score 1.0 when the answer is retrieved: prompt protocol, agent_name and loop agree end to end."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from verl.utils.reward_score import default_compute_score

from cpu_bench.testing.scripted_policy import native_search_policy, tool_call_policy
from cpu_bench.testing.scripted_rollout import run_rows
from verl_search.data.rows import OUTPUT_SCHEMA, build_row
from verl_search.data.schema import QARecord
from verl_search.data.templates import load_templates

PROMPTS = "data_preprocess/prompt.yaml"


async def test_both_templates_run_in_their_loops(retriever, tool_yaml, tokenizer_dir, oracle):
    templates = load_templates(Path(__file__).resolve().parents[3] / PROMPTS).templates
    record = QARecord(
        id="q1",
        question="who wrote hamlet",
        answers=("William Shakespeare",),
        data_source="searchR1_nq",
        ability="fact-reasoning",
    )
    built = [build_row(record, templates[name], "test", i) for i, name in enumerate(("tool_call", "search_r1"))]
    rows = pa.Table.from_pylist(built, schema=OUTPUT_SCHEMA).to_pandas().to_dict("records")  # as read from parquet
    assert [r["agent_name"] for r in rows] == ["tool_agent", "search_r1_agent"]

    tool_policy, native_policy = tool_call_policy(oracle), native_search_policy(oracle)

    def policy(inp):  # each row's model follows the protocol its prompt describes
        return (native_policy if "<search> query </search>" in inp.conversation else tool_policy)(inp)

    result = await run_rows(
        rows,
        policy=policy,
        tool_config_path=tool_yaml,
        tokenizer_dir=tokenizer_dir,
        compute_score=default_compute_score,
    )
    tool_row, native_row = result.trajectories
    assert "<tool_response>" in tool_row.response_text
    assert "<information>" in native_row.response_text
    assert [t.score for t in result.trajectories] == [1.0, 1.0]
    assert set(retriever.queries) == {"who wrote hamlet?"}
