"""The data of ``make train --world pages``: its single-hop question splits, the run's two-tool YAML (search with urls,
access) and its SFT rows (search, open the page, answer; or the answer alone, from memory).

Invariant: the splits are disjoint and a pure function of the world and the split seed; the tool YAML the trajectories
were built with is the one GRPO and evaluation use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from cpu_bench.train.config import TrainConfig
from cpu_bench.train.pages_sft import build_page_turns, page_row
from cpu_bench.train.questions import SPLITS, SplitSizes, all_questions
from cpu_bench.train.sft_data import BuildReport, build_trajectories, hop_source, sft_row
from local_dense_retriever.toy.world import ToyWorld
from verl_search.atomic import atomic_path
from verl_search.launch.tool_yaml import write_tool_config
from verl_search.resources import SEARCH_ACCESS_TOOL_YAML, shipped_file
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import AccessToolConfig, SearchToolConfig

#: the prompt template of the pages world's rows (data_preprocess/prompt.yaml)
TEMPLATE = "tool_call_access"
TOOL_YAML = "search_access_tool_config.yaml"
#: the access tool's cap on one window (its least): every page of the pages world is one window
PAGE_WINDOW_CHARS = 1000


def split_single_hop(world: ToyWorld, sizes: SplitSizes) -> dict[str, list[dict]]:
    """``{"sft", "rl", "eval"}`` of the world's single-hop questions (the pages world asks no two-hop question: its
    bridge would be on a page, past the tiny model's context); eval is drawn first."""
    rows = [q for q in all_questions(world) if int(q["metadata"]["hops"]) == 1]
    wanted = sum(getattr(sizes, name) for name in SPLITS)
    if wanted > len(rows):
        raise ValueError(f"the world has {len(rows)} single-hop questions; the splits ask for {wanted}")
    order = np.random.default_rng([sizes.seed, 0x9A6E5]).permutation(len(rows)).tolist()
    out, start = {}, 0
    for name in ("eval", "rl", "sft"):
        out[name] = [rows[i] for i in order[start : start + getattr(sizes, name)]]
        start += getattr(sizes, name)
    return {name: out[name] for name in SPLITS}


def write_tool_yaml(config: TrainConfig, url: str, path: Path) -> Path:
    """The shipped two-tool YAML with this run's retriever, the search settings on search and one page per window."""
    write_tool_config(shipped_file(SEARCH_ACCESS_TOOL_YAML), path, url)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    search, access = (tool["config"] for tool in data["tools"])
    search.update(topk=config.search.topk, max_result_chars=config.search.max_result_chars, show_urls=True)
    access.update(max_result_chars=PAGE_WINDOW_CHARS)
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def tool_configs(tool_yaml: Path) -> tuple[SearchToolConfig, AccessToolConfig]:
    search, access = (tool["config"] for tool in yaml.safe_load(tool_yaml.read_text(encoding="utf-8"))["tools"])
    return SearchToolConfig.from_dict(search), AccessToolConfig.from_dict(access)


async def sft_rows(
    questions: list[dict], direct: set[int], tool_yaml: Path, settings
) -> tuple[list[dict], BuildReport, list[dict], int]:
    """The SFT rows (page trajectories of the questions not in ``direct``, the answer alone for those in it), the
    build report, the answer-only baseline's rows of every question, and how many rows answer from memory."""
    search, access = tool_configs(tool_yaml)
    searched = [q for i, q in enumerate(questions) if i not in direct]
    try:
        built, report = await build_page_turns(searched, search, access)
        answers, _ = await build_trajectories(questions, [None] * len(questions), search, answer_only=True)
    finally:
        await RetrievalClient.close_all()
    template = settings.hermes_template
    rows = [page_row(q, turns, template, settings.tool_schemas, hop_source(1)) for q, turns in built]
    baseline = [sft_row(t, "hermes", settings, hop_source(t.hops)) for t in answers]
    rows += [baseline[i] for i in sorted(direct)]
    return rows, report, baseline, len(direct)
