"""The SFT warm-start data: disjoint seeded splits, trajectories whose answers come from what the retriever returned,
model turns each loop parses as intended, and SFT tokens equal to what verl's agent loops lay out at rollout, with the
loss only on the model's own text.

The retriever is the word-overlap stub (cpu_bench.testing.stub_retriever) serving a small generated toy world, so no
encoder runs; the rollouts are verl's real AgentLoopWorker with a scripted policy replaying the SFT model turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from cpu_bench.testing.scripted_policy import scripted_turns
from cpu_bench.testing.scripted_rollout import run_rows
from cpu_bench.testing.stub_retriever import StubServer
from cpu_bench.train.data_stage import bridge_name, tool_schemas
from cpu_bench.train.questions import SplitSizes, all_questions, split_questions
from cpu_bench.train.sft_data import (
    RowSettings,
    build_trajectories,
    hop_source,
    model_turns,
    sft_row,
    write_rows,
)
from cpu_bench.train.sft_dataset import SearchSFTDataset
from local_dense_retriever.toy.world import ToyWorld
from verl_search.agent_loop import parse_action
from verl_search.data.rows import build_row
from verl_search.data.schema import QARecord
from verl_search.data.templates import load_templates
from verl_search.launch.tool_yaml import write_tool_config
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig

REPO = Path(__file__).resolve().parents[3]
WORLD = ToyWorld(200, 0)


@pytest.fixture(scope="module")
def toy_stub():
    corpus = [{"id": str(r), "contents": WORLD.passage(r)} for r in range(WORLD.num_passages)]
    with StubServer(corpus) as server:
        yield server


@pytest.fixture
def tool_yaml(toy_stub, tmp_path) -> Path:
    settings = {"topk": 1, "max_result_chars": 400, "timeout": 5.0}
    source = REPO / "tool_config" / "search_tool_config.yaml"
    return write_tool_config(source, tmp_path / "search_tool_config.yaml", f"{toy_stub.url}/retrieve", settings)


@pytest.fixture
async def built(tool_yaml):
    """Trajectories for a few single- and two-hop questions, searched on the stub."""
    search = SearchToolConfig.from_dict(yaml.safe_load(tool_yaml.read_text())["tools"][0]["config"])
    questions = [q for q in all_questions(WORLD) if q["metadata"]["hops"] == 1][:12]
    questions += [q for q in all_questions(WORLD) if q["metadata"]["hops"] == 2][:12]
    trajectories, report = await build_trajectories(questions, [bridge_name(WORLD, q) for q in questions], search)
    yield trajectories, report, questions
    await RetrievalClient.close_all()


@pytest.fixture
def settings(tool_yaml) -> RowSettings:
    templates = load_templates(REPO / "data_preprocess" / "prompt.yaml")
    return RowSettings(
        hermes_template=templates.get("tool_call")[1],
        native_template=templates.get("search_r1")[1],
        tool_schemas=tool_schemas(tool_yaml),
    )


def test_splits_are_disjoint_half_two_hop_and_seeded():
    sizes = SplitSizes(sft=60, rl=30, eval=20, seed=3)
    splits = split_questions(WORLD, sizes)
    texts = {name: {q["question"] for q in rows} for name, rows in splits.items()}
    assert [len(texts[n]) for n in ("sft", "rl", "eval")] == [60, 30, 20]
    assert not texts["sft"] & texts["rl"] and not texts["sft"] & texts["eval"] and not texts["rl"] & texts["eval"]
    assert sum(q["metadata"]["hops"] == 2 for q in splits["eval"]) == 10
    assert split_questions(WORLD, sizes) == splits
    assert split_questions(WORLD, SplitSizes(sft=60, rl=30, eval=20, seed=4))["eval"] != splits["eval"]
    # growing the training splits never changes the held-out questions
    assert split_questions(WORLD, SplitSizes(sft=90, rl=40, eval=20, seed=3))["eval"] == splits["eval"]


async def test_answers_and_bridges_come_from_the_retrieved_text(built):
    trajectories, report, questions = built
    assert report.built == len(trajectories) and report.built + sum(report.skipped.values()) == len(questions)
    assert {t.hops for t in trajectories} == {1, 2}  # the word-overlap stub misses some; the others are built
    by_question = {t.question.rstrip("?"): t for t in trajectories}
    for q in questions:
        t = by_question.get(q["question"].rstrip("?"))
        if t is None:
            continue
        assert t.answer in q["golden_answers"]
        assert t.answer.lower() in t.searches[-1][1].lower()  # read from the last result, not from the gold list
        assert t.searches[0][0] == t.question  # the first search is the question itself
        if q["metadata"]["hops"] == 2:
            bridge = bridge_name(WORLD, q)
            assert [s[0] for s in t.searches] == [t.question, bridge]
            assert bridge.lower() in t.searches[0][1].lower()
        else:
            assert len(t.searches) == 1


async def test_hermes_turns_parse_with_verls_parser_and_native_turns_with_parse_action(built, tokenizer):
    from verl.experimental.agent_loop.tool_parser import ToolParser

    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    trajectories, _, _ = built
    for t in trajectories:
        hermes, native = model_turns(t, "hermes"), model_turns(t, "native")
        for step in hermes[:-1]:
            _, calls = await parser.extract_tool_calls(tokenizer.encode(step.text, add_special_tokens=False))
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"query_list": [step.query]})]
        _, calls = await parser.extract_tool_calls(tokenizer.encode(hermes[-1].text, add_special_tokens=False))
        assert calls == [] and parse_action(hermes[-1].text) == ("answer", t.answer)
        assert [parse_action(s.text) for s in native] == [("search", s.query) for s in native[:-1]] + [
            ("answer", t.answer)
        ]


def _dataset(rows: list[dict], path: Path, tokenizer) -> SearchSFTDataset:
    write_rows(rows, path)
    config = OmegaConf.create({"pad_mode": "no_padding", "max_length": 4096, "truncation": "error"})
    return SearchSFTDataset(str(path), tokenizer, config)


def _rl_row(question: str, golds: list[str], template, hops: int) -> dict:
    record = QARecord(
        id="q", question=question, answers=tuple(golds), data_source=hop_source(hops), ability="fact-reasoning"
    )
    return build_row(record, template, "test", 0)


@pytest.mark.parametrize("protocol", ["native", "hermes"])
async def test_sft_tokens_are_the_agent_loops_rollout_with_loss_only_on_model_text(
    built, settings, tool_yaml, tokenizer_dir, tokenizer, tmp_path, protocol
):
    trajectories, _, _ = built
    two_hop = next(t for t in trajectories if t.hops == 2)
    rows = [sft_row(two_hop, protocol, settings, hop_source(2))]
    item = _dataset(rows, tmp_path / "sft.parquet", tokenizer)[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()

    template = settings.native_template if protocol == "native" else settings.hermes_template
    rl_row = _rl_row(two_hop.question, list(two_hop.golden_answers), template, 2)
    texts = [s.text for s in model_turns(two_hop, protocol)]
    result = await run_rows(
        [rl_row], policy=scripted_turns(*texts), tool_config_path=tool_yaml, tokenizer_dir=tokenizer_dir
    )
    await RetrievalClient.close_all()
    rollout = result.trajectories[0]
    rolled = rollout.prompt_ids + rollout.response_ids
    rolled_mask = [0] * len(rollout.prompt_ids) + rollout.response_mask

    if protocol == "native":
        assert ids == rolled and mask == rolled_mask
    else:  # the chat template ends every turn with "<|im_end|>\n"; at rollout the "\n" opens the tool turn
        newline = tokenizer.encode("\n", add_special_tokens=False)
        assert ids == rolled + newline
        differs = [i for i, (a, b) in enumerate(zip(mask, rolled_mask, strict=False)) if a != b]
        assert all(rolled[i] == newline[0] and rolled[i - 1] == tokenizer.eos_token_id for i in differs)
        assert len(differs) == len(texts) - 1  # one per tool turn

    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    for text in texts:
        assert text in trained
    for _query, result_text in two_hop.searches:
        assert result_text.strip()[:40] not in trained  # search results are never trained on
    assert "<information>" not in trained and "<tool_response>" not in trained
    assert torch.equal(item["position_ids"], torch.arange(len(ids)))
