"""The output files as verl 0.9.1 consumes them: RLHFDataset with a user's data config, then our reward."""

from __future__ import annotations

import numpy as np
import pytest

from verl_search.reward import compute_score


@pytest.fixture
def processed(search_r1_dir, tmp_path, run_cli):
    out = tmp_path / "processed"
    assert run_cli("--input_dir", search_r1_dir, "--local_dir", out, "--val_per_source", "2")[0] == 0
    return out


def _dataset(path, tokenizer, repo_root, *overrides: str):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from cpu_bench.testing.scripted_rollout import verl_trainer_config

    tool_config = repo_root / "tool_config" / "search_tool_config.yaml"
    config = verl_trainer_config(
        [
            f"data.train_files={path}",
            "data.max_prompt_length=1024",
            "data.filter_overlong_prompts=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
            *overrides,
        ]
    )
    return RLHFDataset(data_files=str(path), tokenizer=tokenizer, config=config.data)


@pytest.mark.parametrize("name", ["train.parquet", "test.parquet", "val_subset.parquet"])
def test_rlhf_dataset_loads_every_output_and_rows_route_to_the_search_tool(name, processed, qwen_tokenizer, repo_root):
    dataset = _dataset(processed / name, qwen_tokenizer, repo_root)
    expected = {"train.parquet": 7, "test.parquet": 14, "val_subset.parquet": 6}[name]
    assert len(dataset) == expected  # nothing filtered out as too long with the tool schema in the prompt
    assert dataset.tool_schemas and dataset.tool_schemas[0]["function"]["name"] == "search"

    item = dataset[0]
    assert item["agent_name"] == "tool_agent"
    assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
    create_kwargs = item["tools_kwargs"]["search"]["create_kwargs"]
    assert create_kwargs["data_source"] == item["data_source"]
    assert create_kwargs["question"] == item["extra_info"]["question"]
    assert list(create_kwargs["ground_truth"]["target"]) == list(item["reward_model"]["ground_truth"]["target"])

    # the prompt the rollout sees carries the tool schema and the question
    text = qwen_tokenizer.apply_chat_template(item["raw_prompt"], tools=dataset.tool_schemas, tokenize=False,
                                              add_generation_prompt=True)  # fmt: skip
    assert '"name": "search"' in text and item["extra_info"]["question"] in text

    # the ground truth exactly as verl hands it to the reward (whatever container type it arrives in)
    gold = item["reward_model"]["ground_truth"]
    answer = np.asarray(gold["target"]).tolist()[0]
    assert compute_score(item["data_source"], f"<answer>{answer}</answer>", gold)["score"] == 1.0
    assert compute_score(item["data_source"], "<answer>wrong</answer>", gold)["score"] == 0.0


def test_overlong_prompts_are_filtered_by_verl(processed, qwen_tokenizer, repo_root):
    """The length verl measures includes our template; a too-small max_prompt_length drops the rows."""
    dataset = _dataset(processed / "test.parquet", qwen_tokenizer, repo_root, "data.max_prompt_length=16")
    assert len(dataset) == 0
