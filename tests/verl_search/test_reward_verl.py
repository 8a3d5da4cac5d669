"""Our reward against verl 0.9.1 itself: same EM as verl's Search-R1 reward, loadable by verl's config keys."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import verl_search.reward as reward
from verl_search.reward import compute_score, normalize_answer

verl = pytest.importorskip("verl")
from verl.experimental.reward_loop import migrate_legacy_reward_impl  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl.utils.reward_score import search_r1_like_qa_em  # noqa: E402

FRAGMENTS = ["<answer>", "</answer>", "<think>", "</think>", "Beijing", "beijing", "The", "a", " ", "\n", ",", "!",
             "Peking", "New York", "x", "answer", "<", ">", "/", "é", "Ünïcode"]  # fmt: skip
GOLDS = ["Beijing", "Peking", "the Beijing", "New York", "x", "a x", "Ünïcode"]

responses = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join)
golds = st.lists(
    st.one_of(st.sampled_from(GOLDS), st.text(min_size=1, max_size=8).filter(lambda s: normalize_answer(s))),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(response=responses, gold=golds)
def test_em_equals_verls_search_r1_reward_on_plain_responses(response, gold):
    """Plain responses (no retrieved blocks), golds that normalise to something: identical to verl's score."""
    if "<information>" in response or "<tool_response>" in response:
        return
    ours = compute_score("searchR1_nq", response, {"target": gold})
    theirs = search_r1_like_qa_em.compute_score(response, {"target": gold})
    assert ours["score"] == theirs
    assert ours["em"] == float(theirs > 0)


GENERATED_CONFIG = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
#: the two keys a user sets to use this reward (README / launch scripts)
OUR_REWARD = (
    "reward.custom_reward_function.path=pkg://verl_search.reward",
    "reward.custom_reward_function.name=compute_score",
)
RESPONSE = "<search>capital of china</search><information>Beijing</information><answer>Beijing city</answer>"


def _trainer_config(*overrides: str):
    """verl's full PPO trainer config with a user's command-line overrides, migrated as verl's trainer does."""
    config = OmegaConf.merge(OmegaConf.load(GENERATED_CONFIG), OmegaConf.from_dotlist(list(overrides)))
    return migrate_legacy_reward_impl(config)


@pytest.mark.parametrize("path", ["pkg://verl_search.reward", reward.__file__], ids=["pkg", "file"])
def test_loaded_through_verl_reward_config(path):
    config = _trainer_config(
        f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=compute_score"
    )
    fn = get_custom_reward_fn(config)
    result = fn(data_source="searchR1_nq", solution_str=RESPONSE, ground_truth={"target": ["Beijing"]}, extra_info={})
    assert result["score"] == 0.0 and result["subem"] == 1.0 and result["num_searches"] == 1.0


def test_reward_kwargs_from_verl_config_reach_the_options():
    config = _trainer_config(
        "reward.custom_reward_function.path=pkg://verl_search.reward",
        "reward.custom_reward_function.name=compute_score",
        "reward.custom_reward_function.reward_kwargs.metric=subem",
    )
    fn = get_custom_reward_fn(config)
    assert fn(data_source="searchR1_nq", solution_str=RESPONSE, ground_truth={"target": ["Beijing"]})["score"] == 1.0


def test_legacy_top_level_key_still_works():
    config = _trainer_config(
        "custom_reward_function.path=pkg://verl_search.reward", "custom_reward_function.name=compute_score"
    )
    fn = get_custom_reward_fn(config)
    assert (
        fn(data_source="searchR1_nq", solution_str="<answer>Beijing</answer>", ground_truth=["Beijing"])["score"] == 1.0
    )


def test_bad_reward_kwargs_fail_at_first_call_naming_the_key():
    config = _trainer_config(
        "reward.custom_reward_function.path=pkg://verl_search.reward",
        "reward.custom_reward_function.name=compute_score",
        "reward.custom_reward_function.reward_kwargs.metirc=f1",
    )
    fn = get_custom_reward_fn(config)
    with pytest.raises(ValueError, match="metirc"):
        fn(data_source="searchR1_nq", solution_str=RESPONSE, ground_truth=["Beijing"])


async def test_scores_a_tool_agent_trajectory_through_verls_reward_manager(tmp_path):
    """verl's naive reward manager decodes the response tokens (special tokens skipped) and calls our reward."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    from cpu_bench.train.local_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tmp_path)
    config = _trainer_config(
        "reward.custom_reward_function.path=pkg://verl_search.reward",
        "reward.custom_reward_function.name=compute_score",
    )
    manager = load_reward_manager(config, tokenizer)

    def trajectory(final_answer: str) -> str:
        return (
            '<think>look it up</think>\n<tool_call>\n{"name": "search", "arguments": {"query_list": ["hamlet"]}}\n'
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: Hamlet) <answer>William "
            "Shakespeare</answer> wrote it\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            f"<answer>{final_answer}</answer><|im_end|>"
        )

    async def score(response: str) -> dict:
        prompt_ids = tokenizer.encode("<|im_start|>user\nwho wrote hamlet?<|im_end|>\n<|im_start|>assistant\n")
        response_ids = tokenizer.encode(response)
        data = DataProto.from_dict(
            tensors={
                "prompts": torch.tensor([prompt_ids]),
                "responses": torch.tensor([response_ids]),
                "attention_mask": torch.ones(1, len(prompt_ids) + len(response_ids), dtype=torch.long),
            },
            non_tensors={
                "data_source": np.array(["searchR1_nq"], dtype=object),
                "reward_model": np.array([{"ground_truth": {"target": np.array(["William Shakespeare"])}}]),
                "extra_info": np.array([{"index": 0}], dtype=object),
            },
        )
        return await manager.run_single(data)

    right, wrong = await score(trajectory("Shakespeare, William")), await score(trajectory("Marlowe"))
    assert right["reward_score"] == 0.0  # "Shakespeare, William" is not an exact match
    assert right["reward_extra_info"]["f1"] == 1.0 and right["reward_extra_info"]["num_searches"] == 1.0
    assert (await score(trajectory("William Shakespeare")))["reward_score"] == 1.0
    assert wrong["reward_score"] == 0.0  # the gold answer in the tool response never counts
