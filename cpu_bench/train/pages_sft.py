"""SFT warm-start trajectories of the pages world, in the hermes protocol of ``tool_agent`` with both tools: search the
question, open the url of the first hit with ``access``, answer with a gold answer the page holds.

Search results and pages come from :func:`verl_search.tool.search_tool.run_search` and
:func:`verl_search.tool.access_tool.run_access`, the calls the tools make at rollout; they go into ``tool`` turns,
never trained on. Invariant: a trajectory is written only when its answer occurs in the page it opened, and every
model turn is a tool call the hermes parser reads (or the answer).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

from cpu_bench.train.sft_data import THINK_ANSWER, THINK_FIRST, BuildReport, TrajectoryError, answer_turn, search_turn
from verl_search.data.rows import shown_question
from verl_search.data.templates import PromptTemplate
from verl_search.tool.access_tool import run_access
from verl_search.tool.config import AccessToolConfig, SearchToolConfig
from verl_search.tool.search_tool import run_search

THINK_OPEN = "I need to open the page."
#: the url a result line names (``Doc 1(Title: T)(URL: u) text``, the search tool's show_urls)
_URL = re.compile(r"\(URL: (\S+?)\)")


def access_turn(url: str, thought: str = THINK_OPEN) -> str:
    """A model turn that opens ``url``: a hermes ``<tool_call>`` of the access tool."""
    call = {"name": "access", "arguments": {"url": url}}
    return f"<think> {thought} </think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def first_url(result: str) -> str:
    """The url of the first hit of a search result; raises TrajectoryError when it names none."""
    found = _URL.search(result)
    if found is None:
        raise TrajectoryError("no url in the search result")
    return found.group(1)


async def page_turns(question: dict, search: SearchToolConfig, access: AccessToolConfig) -> list[tuple[str, str]]:
    """``(model turn, tool result)`` pairs of one pages-world trajectory, the answer turn last (its result empty);
    raises TrajectoryError when the retriever does not lead to a page holding a gold answer."""
    shown = shown_question(question["question"])
    found = await run_search(search, [shown])
    if not found.ok:
        raise TrajectoryError(f"search failed ({found.failure}) for {shown!r}")
    url = first_url(found.text)
    opened = await run_access(access, {"url": url})
    if not opened.ok:
        raise TrajectoryError(f"search failed (access: {opened.failure}) for {url!r}")
    answer = next((g for g in question["golden_answers"] if g.lower() in opened.text.lower()), None)
    if answer is None:
        raise TrajectoryError(f"no gold answer of {shown!r} in the page {url}")
    return [
        (search_turn(shown, "hermes", THINK_FIRST), found.text),
        (access_turn(url), opened.text),
        (answer_turn(answer, THINK_ANSWER), ""),
    ]


def page_row(
    question: dict, turns: list[tuple[str, str]], template: PromptTemplate, tools: list[dict], data_source: str
) -> dict[str, Any]:
    """One row for verl's SFT trainer (``messages`` + ``tools``, as sft_data's hermes rows)."""
    messages = template.render(shown_question(question["question"]))
    for text, result in turns:
        messages.append({"role": "assistant", "content": text})
        if result:
            messages.append({"role": "tool", "content": result})
    answer = re.search(r"<answer> (.*) </answer>", turns[-1][0])
    return {
        "messages": messages,
        "tools": tools,
        "segments": [],
        "protocol": "hermes",
        "data_source": data_source,
        "question": shown_question(question["question"]),
        "golden_answers": list(question["golden_answers"]),
        "answer": answer.group(1) if answer else "",
        "hops": int(question["metadata"]["hops"]),
    }


async def build_page_turns(
    questions: Sequence[dict], search: SearchToolConfig, access: AccessToolConfig, *, concurrency: int = 16
) -> tuple[list[tuple[dict, list[tuple[str, str]]]], BuildReport]:
    """The trajectories of ``questions`` (in order, skipping those the retriever does not lead to their answer)."""
    gate = asyncio.Semaphore(concurrency)
    report = BuildReport()

    async def one(q: dict) -> list[tuple[str, str]] | TrajectoryError:
        async with gate:
            try:
                return await page_turns(q, search, access)
            except TrajectoryError as e:
                return e

    out = []
    for q, result in zip(questions, await asyncio.gather(*map(one, questions)), strict=True):
        if isinstance(result, TrajectoryError):
            report.skip("no gold answer" if "no gold answer" in str(result) else "search failed")
        else:
            out.append((q, result))
            report.built += 1
    return out, report
