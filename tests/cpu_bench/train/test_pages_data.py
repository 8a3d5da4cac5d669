"""The pages world's data for make train: single-hop splits, the two-tool YAML, the model turns the hermes parser
reads, the forced access opening of the trainer test and the table's pages column."""

from __future__ import annotations

import asyncio
import json

import yaml

from cpu_bench.testing.forced_prefix import ForcingSettings, Openings
from cpu_bench.train.config import TrainConfig, pages_world
from cpu_bench.train.pages_data import PAGE_WINDOW_CHARS, split_single_hop, write_tool_yaml
from cpu_bench.train.pages_sft import access_turn, first_url
from cpu_bench.train.questions import SplitSizes
from cpu_bench.train.summary import StageResult, render_table
from local_dense_retriever.toy.world import ToyWorld


def test_splits_are_single_hop_and_disjoint():
    splits = split_single_hop(ToyWorld(200, 0), SplitSizes(sft=20, rl=10, eval=6, seed=4))
    texts = [q["question"] for rows in splits.values() for q in rows]
    assert len(texts) == len(set(texts)) == 36
    assert all(q["metadata"]["hops"] == 1 for rows in splits.values() for q in rows)
    assert split_single_hop(ToyWorld(200, 0), SplitSizes(sft=20, rl=10, eval=6, seed=4)) == splits


def test_the_tool_yaml_has_both_tools_with_urls_shown_and_a_page_per_window(tmp_path):
    path = write_tool_yaml(TrainConfig(), "http://127.0.0.1:9/retrieve", tmp_path / "t.yaml")
    search, access = yaml.safe_load(path.read_text())["tools"]
    assert search["tool_schema"]["function"]["name"] == "search" and search["config"]["show_urls"] is True
    assert access["tool_schema"]["function"]["name"] == "access"
    assert access["config"]["max_result_chars"] == PAGE_WINDOW_CHARS
    assert {search["config"]["retrieval_service_url"], access["config"]["retrieval_service_url"]} == {
        "http://127.0.0.1:9/retrieve"
    }


def test_the_access_turn_is_a_hermes_call_verl_parses(tokenizer):
    from verl.experimental.agent_loop.tool_parser import ToolParser

    url = first_url('Doc 1(Title: "Ana Kovar")(URL: https://en.wikipedia.org/wiki/Ana_Kovar) Ana Kovar is a person.')
    turn = access_turn(url)
    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    _, calls = asyncio.run(parser.extract_tool_calls(tokenizer.encode(turn)))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("access", {"url": url})]
    assert tokenizer.decode(tokenizer.encode(url)) == url  # the byte-level tokenizer holds any url


def test_the_pages_world_runs_tool_agent_and_fits_its_sequences():
    config = pages_world(TrainConfig())
    assert config.world.kind == "pages" and config.grpo.agent == "tool_agent"
    assert config.sft.max_length >= 1280 and config.grpo.max_response_length >= 512


def test_forced_openings_open_the_url_a_search_result_names_then_answer():
    openings = Openings(ForcingSettings(search_every=1, access_every=1, answer="x", answer_every=1))
    asked = "<|im_start|>user\nQuestion: Who founded the Ko Society?<|im_end|>\n"
    result = '<tool_response>\nDoc 1(Title: "Ko Society")(URL: https://en.wikipedia.org/wiki/Ko_Society) The Ko'
    assert '"name": "access"' in openings.opening_for(asked + result + "\n</tool_response>")
    assert "https://en.wikipedia.org/wiki/Ko_Society" in openings.opening_for(asked + result + "</tool_response>")
    page = result + "</tool_response>\n<tool_response>\n[page 1 of 1] Ko Society\nFounded by Al Bo.</tool_response>"
    assert openings.opening_for(asked + page) == "<answer> x </answer>"


def test_the_table_shows_pages_opened_only_where_a_page_was_opened():
    row = StageResult("after GRPO", "GRPO", 12, 100, 0.3, 0.3, None, 1.0, 1.0, 0, 0.5, pages_per_question=0.9)
    assert "pages opened/q" in render_table([row]) and "| 0.90 | 100 |" in render_table([row])
    without = StageResult("after SFT", "SFT", 0, 100, 0.1, 0.1, None, 1.0, 1.0, 0, 0.5)
    assert "pages opened/q" not in render_table([without])
