"""verl's real trainer on the CPU with both tools in ``tool_agent``'s loop: GRPO steps on the pages world (search
results name a url, the page there holds the answer) against the real retriever serving ``--pages_path``.

What is forced (the test kit's opening policy, see cpu_bench/testing/forced_prefix.py): a random model never calls a
tool, so every first turn opens with a search call on the question, every turn after a result that names a url with an
access call of that url, and every turn after the page with an answer; the rest is the model's own sampling.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_bench.testing.engine_runs import metrics_by_step

FORCED = (
    "path:cpu_bench.testing.forced_prefix.ForcedOpenings,search_every:1,access_every:1,answer:unknown,answer_every:1"
)
PASSAGES = 60


@pytest.fixture(scope="module")
def pages_retriever(tmp_path_factory):
    """The real retrieval service on a small pages world: snippets searched, pages opened from ``--pages_path``."""
    from cpu_bench.train.processes import retrieval_server
    from local_dense_retriever.toy.pages_world import generate_pages_world, server_flags

    folder = tmp_path_factory.mktemp("pages-world")
    world = generate_pages_world(folder / "world", PASSAGES, seed=0)
    with retrieval_server(server_flags(world), folder / "server.log", timeout=300) as url:
        yield url


@pytest.fixture(scope="module")
def pages_rows(tmp_path_factory) -> tuple[Path, Path]:
    """RL and validation rows of the pages world's questions, in the two-tool prompt (tool_agent)."""
    from cpu_bench.train.data_stage import preprocess
    from cpu_bench.train.pages_data import TEMPLATE, split_single_hop
    from cpu_bench.train.questions import SplitSizes
    from local_dense_retriever.toy.world import ToyWorld

    splits = split_single_hop(ToyWorld(PASSAGES, 0), SplitSizes(sft=2, rl=8, eval=2, seed=0))
    folder = tmp_path_factory.mktemp("pages-rows")
    return preprocess(splits["rl"], TEMPLATE, folder / "rl"), preprocess(splits["eval"], TEMPLATE, folder / "eval")


def test_grpo_with_search_and_access_opens_pages(tmp_path, tiny_model, pages_retriever, pages_rows, launch_cpu_run):
    from cpu_bench.train.config import TrainConfig
    from cpu_bench.train.pages_data import PAGE_WINDOW_CHARS, write_tool_yaml

    tool_yaml = write_tool_yaml(TrainConfig(), f"{pages_retriever}/retrieve", tmp_path / "tools.yaml")
    run_dir, rollouts = tmp_path / "run", tmp_path / "rollouts"
    env = {
        "MODEL_PATH": str(tiny_model),
        "TRAIN_DATA": str(pages_rows[0]),
        "VAL_DATA": str(pages_rows[1]),
        "TOOL_CONFIG": str(tool_yaml),
        "RETRIEVER_URL": f"{pages_retriever}/retrieve",
        "AGENT": "tool_agent",
        "MAX_TOOL_RESPONSE_LENGTH": str(PAGE_WINDOW_CHARS),
        "MAX_PROMPT_LENGTH": "1536",
        "MAX_RESPONSE_LENGTH": "1024",
        "TEST_FREQ": "2",
    }
    # a turn of 96 tokens holds the forced access call whole (its url is ~60 tokens of the local tokenizer)
    options = f"+actor_rollout_ref.rollout.engine_kwargs.hf_cpu={{max_tokens_per_turn:96,opening_policy:{{{FORCED}}}}}"
    run = launch_cpu_run(run_dir, env, 2, options, f"trainer.rollout_data_dir={rollouts}", timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    assert sorted(metrics_by_step(run_dir / "metrics-2.jsonl")) == [1, 2]

    # Every trained trajectory searched, then opened the page its first hit named and read it in a tool turn.
    dumped = [json.loads(line) for path in rollouts.glob("*.jsonl") for line in path.open()]
    assert dumped
    for row in dumped:
        output = row["output"]
        assert "(URL: https://en.wikipedia.org/wiki/" in output  # the search result names the page
        assert '"name": "access"' in output
        assert "[page 1 of 1]" in output, output[-1500:]  # the access tool's window of that page
