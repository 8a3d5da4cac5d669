"""The data stage of ``make train``: split the toy questions, write the RL and evaluation parquets with the project's
preprocessing (``verl_search.data``), the run's tool YAML, and the SFT rows (search trajectories and the answer-only
baseline's).

Invariant: every file is written atomically; the SFT, RL and evaluation questions are disjoint; the tool YAML the
trajectories were searched with is the one GRPO and evaluation use. The stage is keyed by the world, search and agent
settings; the tool YAML is rewritten on every run (it names this run's retriever, which no row depends on).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpu_bench.train import pages_data
from cpu_bench.train.config import TrainConfig
from cpu_bench.train.questions import SplitSizes, split_questions
from cpu_bench.train.run_settings import settings_of
from cpu_bench.train.sft_data import (
    PROTOCOLS,
    RowSettings,
    build_trajectories,
    hop_source,
    sft_row,
    write_rows,
)
from cpu_bench.train.stage import Stage
from local_dense_retriever.toy.corpus import generate_toy_dataset
from local_dense_retriever.toy.pages_world import generate_pages_world
from local_dense_retriever.toy.world import ToyWorld
from verl_search.atomic import atomic_path
from verl_search.data.pipeline import PreprocessConfig, run_preprocess
from verl_search.data.templates import load_templates
from verl_search.launch.tool_yaml import write_tool_config
from verl_search.resources import PROMPT_YAML, SEARCH_TOOL_YAML, shipped_file
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig

logger = logging.getLogger(__name__)

TEMPLATES = {"hermes": "tool_call", "native": "search_r1"}
AGENT_TEMPLATE = {"tool_agent": "tool_call", "search_r1_agent": "search_r1"}


@dataclass(frozen=True)
class DataFiles:
    """What the data stage wrote."""

    tool_yaml: Path  # what SFT trajectories were built with and GRPO uses
    sft: Path
    baseline_sft: Path
    rl: Path
    eval: Path
    corpus: Path
    stats: dict[str, Any]
    rows_tool_yaml: Path  # the search tool alone: the base model's rows are rendered with its schema, in every world


def write_tool_yaml(config: TrainConfig, url: str, path: Path) -> Path:
    """The shipped tool YAML with this run's retriever URL, passages per query and result cap."""
    settings = {"topk": config.search.topk, "max_result_chars": config.search.max_result_chars}
    return write_tool_config(shipped_file(SEARCH_TOOL_YAML), path, url, settings)


def tool_schemas(tool_yaml: Path) -> list[dict]:
    """The tool schemas exactly as verl's ToolAgentLoop hands them to the chat template."""
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(str(tool_yaml))
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]


def bridge_name(world: ToyWorld, question: dict) -> str | None:
    """The name of a two-hop question's bridge entity (its second supporting passage), None for single-hop."""
    support = question["metadata"]["supporting_ids"]
    return world.name[int(support[1])] if len(support) > 1 else None


def row_settings(config: TrainConfig, tool_yaml: Path, hermes: str = TEMPLATES["hermes"]) -> RowSettings:
    """How SFT rows are rendered: the shipped prompt templates (``hermes`` names the hermes rows'), the tools'
    schemas, the run's turn limit."""
    templates = load_templates(shipped_file(PROMPT_YAML))
    return RowSettings(
        hermes_template=templates.get(hermes)[1],
        native_template=templates.get(TEMPLATES["native"])[1],
        tool_schemas=tool_schemas(tool_yaml),
        max_turns=config.search.max_turns,
    )


def _qa_jsonl(questions: list[dict], path: Path) -> Path:
    with atomic_path(path) as tmp:
        lines = []
        for q in questions:
            row = {"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]}
            lines.append(json.dumps({**row, "data_source": hop_source(int(q["metadata"]["hops"]))}) + "\n")
        tmp.write_text("".join(lines), encoding="utf-8")
    return path


def preprocess(questions: list[dict], template: str, out_dir: Path) -> Path:
    """verl RL rows for ``questions`` through the project's preprocessing (what ``preprocess_searchR1_dataset.py
    --input_jsonl QA --splits test --template T`` does); returns test.parquet."""
    qa = _qa_jsonl(questions, out_dir / "qa.jsonl")
    config = PreprocessConfig(
        template_file=shipped_file(PROMPT_YAML), template=template, input_jsonl=qa, splits=("test",), local_dir=out_dir
    )
    for output in run_preprocess(config, progress=False):
        logger.info("preprocess %s: %s (%d rows)", out_dir.name, output.path, output.total)
    return out_dir / "test.parquet"


async def _sft_rows(config: TrainConfig, world: ToyWorld, questions: list[dict], tool_yaml: Path) -> tuple:
    """Search trajectories of the SFT questions not answered directly, and answer-only ones of every SFT question
    (the baseline's rows; the direct rows are taken from them)."""
    search_config = SearchToolConfig.from_dict(yaml.safe_load(tool_yaml.read_text())["tools"][0]["config"])
    direct = directly_answered(len(questions), config.search.no_search_share, config.world.split_seed)
    searched = [q for i, q in enumerate(questions) if i not in direct]
    try:
        bridges = [bridge_name(world, q) for q in searched]
        trajectories, report = await build_trajectories(searched, bridges, search_config)
        answer_only, _ = await build_trajectories(questions, [None] * len(questions), search_config, answer_only=True)
    finally:
        await RetrievalClient.close_all()
    return trajectories, report, answer_only, [answer_only[i] for i in sorted(direct)]


def directly_answered(questions: int, share: float, seed: int) -> set[int]:
    """Which of ``questions`` SFT questions (indices) are answered at once without searching: ``share`` of them,
    drawn by ``seed``; the others get search trajectories."""
    import numpy as np

    order = np.random.default_rng([seed, 0xD1EC7]).permutation(questions)
    return set(order[: round(questions * share)].tolist())


def data_key(config: TrainConfig) -> dict[str, Any]:
    """What the data stage's files depend on: the world and search settings and the RL rows' agent loop (not where
    the retriever runs, like ``run_settings``)."""
    return {k: v for k, v in settings_of(config).items() if k.startswith(("world.", "search."))} | {
        "grpo.agent": config.grpo.agent
    }


def prepare_data(config: TrainConfig, url: str, data_dir: Path) -> DataFiles:
    """Run the data stage (see the module docstring), or reuse its folder when it was built with the same key."""

    def build(folder: Path) -> dict[str, Any]:
        return _build_data(config, write_tool_yamls(config, url, folder)[0], folder)

    w = config.world
    make = generate_pages_world if w.kind == "pages" else generate_toy_dataset
    corpus = make(Path(config.out_dir) / w.kind, num_passages=w.passages, seed=w.world_seed).corpus_path
    record = Stage("data", data_dir, data_key(config), build).ensure()
    tool_yaml, rows_tool_yaml = write_tool_yamls(config, url, data_dir)  # this run's retriever
    files = {name: data_dir / f"{name}.parquet" for name in ("sft", "sft_answer_only")}
    rl, evaluation = data_dir / "rl" / "test.parquet", data_dir / "eval" / "test.parquet"
    stats = record.info
    return DataFiles(tool_yaml, files["sft"], files["sft_answer_only"], rl, evaluation, corpus, stats, rows_tool_yaml)


def write_tool_yamls(config: TrainConfig, url: str, folder: Path) -> tuple[Path, Path]:
    """The run's tool YAML and the search-only one the base model's rows are rendered with (the same file but in the
    pages world, whose YAML adds access)."""
    search_only = write_tool_yaml(config, url, folder / "search_tool_config.yaml")
    if config.world.kind != "pages":
        return search_only, search_only
    return pages_data.write_tool_yaml(config, url, folder / pages_data.TOOL_YAML), search_only


def _build_data(config: TrainConfig, tool_yaml: Path, data_dir: Path) -> dict[str, Any]:
    """Write the stage's files into ``data_dir``; returns the data statistics (also in ``data_stats.json``)."""
    world = ToyWorld(config.world.passages, config.world.world_seed)
    w = config.world
    sizes = SplitSizes(w.sft_questions, w.rl_questions, w.eval_questions, w.split_seed)
    pages = w.kind == "pages"
    splits = pages_data.split_single_hop(world, sizes) if pages else split_questions(world, sizes)
    agent_template = pages_data.TEMPLATE if pages else AGENT_TEMPLATE[config.grpo.agent]
    preprocess(splits["rl"], agent_template, data_dir / "rl")
    preprocess(splits["eval"], agent_template, data_dir / "eval")

    if pages:  # every row in the hermes protocol of tool_agent, with both tools' schemas
        settings = row_settings(config, tool_yaml, pages_data.TEMPLATE)
        direct_ids = directly_answered(len(splits["sft"]), config.search.no_search_share, w.split_seed)
        rows, report, baseline_rows, direct = asyncio.run(
            pages_data.sft_rows(splits["sft"], direct_ids, tool_yaml, settings)
        )
        protocols = ["hermes"] * len(rows)
    else:
        searched, report, baseline, answered = asyncio.run(_sft_rows(config, world, splits["sft"], tool_yaml))
        trajectories = searched + answered
        settings = row_settings(config, tool_yaml)
        every = round(1 / config.search.hermes_share) if config.search.hermes_share > 0 else 0
        protocols = [PROTOCOLS[0] if every and i % every == 0 else PROTOCOLS[1] for i in range(len(trajectories))]
        rows = [sft_row(t, p, settings, hop_source(t.hops)) for t, p in zip(trajectories, protocols, strict=True)]
        baseline_rows = [sft_row(t, "native", settings, hop_source(t.hops)) for t in baseline]
        direct = len(answered)
    write_rows(rows, data_dir / "sft.parquet")
    write_rows(baseline_rows, data_dir / "sft_answer_only.parquet")
    stats = {
        "questions": {name: len(rows) for name, rows in splits.items()},
        "sft_trajectories": report.built,
        "sft_answered_without_search": direct,
        "sft_skipped": report.skipped,
        "sft_protocols": {p: protocols.count(p) for p in PROTOCOLS},
    }
    with atomic_path(data_dir / "data_stats.json") as tmp:
        tmp.write_text(json.dumps(stats, indent=2), encoding="utf-8")
    q, skipped = stats["questions"], sum(report.skipped.values())
    logger.info(
        "data: %d SFT, %d RL and %d held-out questions; SFT: %d searched, %d answered from memory, %d skipped "
        "(details: %s)",
        q.get("sft", 0), q.get("rl", 0), q.get("eval", 0), report.built, direct, skipped,
        data_dir / "data_stats.json",
    )  # fmt: skip
    return stats
