"""SFT warm-start trajectories for the toy world, in both search protocols, built from the real retriever's results.

A trajectory searches the question, then (two-hop) the bridge entity named in the first result, and answers with a
gold answer found in the last result. Search results come from :func:`verl_search.tool.search_tool.run_search`, the
same call and formatting the tool and the native loop use at rollout. Rows are written for verl's SFT trainer:
``messages`` + ``tools`` (hermes, ``tool_agent``: results in ``tool`` turns, never trained on) and, for the native
``search_r1_agent`` protocol, ``segments`` (the response as the loop lays it out: model text with ``loss`` 1,
``<information>`` blocks with ``loss`` 0; read by :class:`cpu_bench.train.sft_dataset.SearchSFTDataset`).
Invariant: a trajectory is written only when its answer (and bridge) occur in the retrieved text it follows; every
model turn parses as the loop at rollout parses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from verl_search.agent_loop import SearchR1LoopConfig
from verl_search.data.rows import shown_question
from verl_search.data.templates import PromptTemplate
from verl_search.errors import VerlSearchError
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.search_tool import run_search

logger = logging.getLogger(__name__)

Protocol = Literal["hermes", "native"]
PROTOCOLS: tuple[Protocol, ...] = ("hermes", "native")
THINK_FIRST = "I need to search for this."
THINK_BRIDGE = "I need one more search."
THINK_ANSWER = "I found the answer."


class TrajectoryError(VerlSearchError, ValueError):
    """A trajectory cannot be built faithfully (the retriever did not surface what the next turn needs)."""


@dataclass(frozen=True)
class Step:
    """One model turn, and the search result that followed it (``None`` for the final answer turn)."""

    text: str
    query: str | None = None
    result: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """A whole search episode for one question, independent of the protocol that renders it."""

    question: str
    golden_answers: tuple[str, ...]
    hops: int
    answer: str
    searches: tuple[tuple[str, str], ...]  # (query, result text) in order
    extra: dict[str, Any] = field(default_factory=dict)


def _contains(text: str, needle: str) -> bool:
    return needle.lower() in text.lower()


def search_turn(query: str, protocol: Protocol, thought: str) -> str:
    """A model turn that searches ``query``: a hermes ``<tool_call>`` or Search-R1's ``<search>``."""
    if protocol == "native":
        return f"<think> {thought} </think>\n<search> {query} </search>"
    call = {"name": "search", "arguments": {"query_list": [query]}}
    return f"<think> {thought} </think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def answer_turn(answer: str, thought: str | None = THINK_ANSWER) -> str:
    """The final model turn."""
    head = f"<think> {thought} </think>\n" if thought else ""
    return f"{head}<answer> {answer} </answer>"


def native_observation(result: str, turn: int, max_turns: int, final_instruction: str) -> str:
    """What ``search_r1_agent`` appends after the search of assistant turn ``turn`` (1-based)."""
    text = f"\n\n<information>{result.strip()}</information>\n\n"
    if turn + 1 >= max_turns:
        text += final_instruction
    return text


async def build_trajectory(
    question: dict, bridge_name: str | None, search: SearchToolConfig, *, answer_only: bool = False
) -> Trajectory:
    """Search like the policy should and pick the answer from what came back; raises TrajectoryError otherwise.

    ``question`` is a toy QA row; ``bridge_name`` is the name of the two-hop bridge entity (None for single-hop).
    ``answer_only`` builds the no-search baseline's trajectory (the gold answer, no search).
    """
    shown = shown_question(question["question"])
    golds = tuple(question["golden_answers"])
    hops = int(question["metadata"]["hops"])
    if answer_only:
        return Trajectory(shown, golds, hops, golds[0], ())
    searches: list[tuple[str, str]] = []
    queries = [shown] if hops == 1 else [shown, bridge_name]
    for i, query in enumerate(queries):
        if query is None:
            raise TrajectoryError(f"two-hop question without a bridge entity: {shown}")
        outcome = await run_search(search, [query])
        if not outcome.ok:
            raise TrajectoryError(f"search failed ({outcome.failure}) for {query!r}")
        if i + 1 < len(queries) and not _contains(outcome.text, queries[i + 1]):
            raise TrajectoryError(f"the bridge {queries[i + 1]!r} is not in the results for {query!r}")
        searches.append((query, outcome.text))
    answer = next((g for g in golds if _contains(searches[-1][1], g)), None)
    if answer is None:
        raise TrajectoryError(f"no gold answer of {shown!r} in the last results")
    return Trajectory(shown, golds, hops, answer, tuple(searches))


def model_turns(trajectory: Trajectory, protocol: Protocol) -> list[Step]:
    """The model turns of ``trajectory`` in ``protocol``, each with the search result that follows it."""
    steps = []
    for i, (query, result) in enumerate(trajectory.searches):
        thought = THINK_FIRST if i == 0 else THINK_BRIDGE
        steps.append(Step(search_turn(query, protocol, thought), query, result))
    thought = THINK_ANSWER if trajectory.searches else None
    steps.append(Step(answer_turn(trajectory.answer, thought)))
    return steps


@dataclass(frozen=True)
class RowSettings:
    """What the rendered rows must agree with at rollout."""

    hermes_template: PromptTemplate
    native_template: PromptTemplate
    tool_schemas: list[dict]  # as ToolAgentLoop passes them to the chat template
    max_turns: int = 4
    final_instruction: str = SearchR1LoopConfig().final_turn_instruction


def sft_row(trajectory: Trajectory, protocol: Protocol, settings: RowSettings, data_source: str) -> dict[str, Any]:
    """One row for verl's SFT trainer (``messages``, ``tools``, ``segments``) plus columns for reading it back."""
    steps = model_turns(trajectory, protocol)
    if protocol == "hermes":
        messages = settings.hermes_template.render(trajectory.question)
        for step in steps:
            messages.append({"role": "assistant", "content": step.text})
            if step.result is not None:
                messages.append({"role": "tool", "content": step.result})
        tools: list[dict] | None = settings.tool_schemas
        segments: list[dict] = []
    else:
        messages = settings.native_template.render(trajectory.question)
        segments = []
        for turn, step in enumerate(steps, start=1):
            segments.append({"text": step.text, "loss": 1})
            if step.result is not None:
                observation = native_observation(step.result, turn, settings.max_turns, settings.final_instruction)
                segments.append({"text": observation, "loss": 0})
        messages.append({"role": "assistant", "content": "".join(s["text"] for s in segments)})
        tools = None
    return {
        "messages": messages,
        "tools": tools,
        "segments": segments,
        "protocol": protocol,
        "data_source": data_source,
        "question": trajectory.question,
        "golden_answers": list(trajectory.golden_answers),
        "answer": trajectory.answer,
        "hops": trajectory.hops,
    }


@dataclass
class BuildReport:
    """How many questions became trajectories, and why the others did not."""

    built: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _reason(error: TrajectoryError) -> str:
    text = str(error)
    for key in ("bridge", "no gold answer", "search failed"):
        if key in text:
            return key
    return "other"


async def build_trajectories(
    questions: Sequence[dict],
    bridge_names: Sequence[str | None],
    search: SearchToolConfig,
    *,
    answer_only: bool = False,
    concurrency: int = 16,
) -> tuple[list[Trajectory], BuildReport]:
    """Trajectories for ``questions`` (in order, skipping those that cannot be built faithfully)."""
    gate = asyncio.Semaphore(concurrency)
    report = BuildReport()

    async def one(q: dict, bridge: str | None) -> Trajectory | TrajectoryError:
        async with gate:
            try:
                return await build_trajectory(q, bridge, search, answer_only=answer_only)
            except TrajectoryError as e:
                return e

    results = await asyncio.gather(*(one(q, b) for q, b in zip(questions, bridge_names, strict=True)))
    out = []
    for result in results:
        if isinstance(result, TrajectoryError):
            report.skip(_reason(result))
        else:
            out.append(result)
            report.built += 1
    return out, report


def hop_source(hops: int) -> str:
    """The data source a toy question is reported under (EM per hop count)."""
    return f"toy_{hops}hop"


def write_rows(rows: list[dict], path: Path) -> Path:
    """Write SFT rows to ``path`` (parquet), atomically."""
    import pandas as pd

    from verl_search.atomic import atomic_path

    with atomic_path(Path(path)) as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
    return Path(path)
