"""QARecord + prompt template -> one verl RLHFDataset row, and the fixed parquet schema of those rows.

Invariant: every row routes to the ``search`` tool (``tools_kwargs.search.create_kwargs``) and names its agent loop.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from verl_search.data.schema import QARecord
from verl_search.data.templates import PromptTemplate

#: the tool name the rows route to; must equal the function name in tool_config/search_tool_config.yaml
TOOL_NAME = "search"

_GROUND_TRUTH = pa.struct([("target", pa.list_(pa.string()))])

#: column order and types of every output file (fixed, so reruns are byte-identical and splits concatenate)
OUTPUT_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", _GROUND_TRUTH)])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("split", pa.string()),
                    ("id", pa.string()),
                    ("question", pa.string()),
                    ("need_tools_kwargs", pa.bool_()),
                    (
                        "tools_kwargs",
                        pa.struct(
                            [
                                (
                                    TOOL_NAME,
                                    pa.struct(
                                        [
                                            (
                                                "create_kwargs",
                                                pa.struct(
                                                    [
                                                        ("ground_truth", _GROUND_TRUTH),
                                                        ("question", pa.string()),
                                                        ("data_source", pa.string()),
                                                    ]
                                                ),
                                            )
                                        ]
                                    ),
                                )
                            ]
                        ),
                    ),
                ]
            ),
        ),
        ("agent_name", pa.string()),
    ]
)


def shown_question(question: str) -> str:
    """The question as the model sees it: stripped, ending in '?' (Search-R1's convention)."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def build_row(record: QARecord, template: PromptTemplate, split: str, index: int) -> dict[str, Any]:
    """The verl row for ``record``; ``index`` is the record's position in its input split."""
    question = shown_question(record.question)
    ground_truth = {"target": list(record.answers)}
    return {
        "data_source": record.data_source,
        "prompt": template.render(question),
        "ability": record.ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "index": index,
            "split": split,
            "id": record.id,
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {
                TOOL_NAME: {
                    "create_kwargs": {
                        "ground_truth": ground_truth,
                        "question": question,
                        "data_source": record.data_source,
                    }
                }
            },
        },
        "agent_name": template.agent_name,
    }
