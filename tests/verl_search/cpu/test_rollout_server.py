"""The CPU rollout server: it answers verl's ``generate`` within the token budget with log-probs, takes the actor's
weights (refusing names the served model lacks), and a replica runs it unless the options name a test subclass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_search.cpu.options import CpuRolloutOptions
from verl_search.cpu.rollout import server_class
from verl_search.cpu.rollout_server import CpuRolloutServer
from verl_search.errors import CpuRolloutConfigError

CONFIG = SimpleNamespace(max_model_len=512, prompt_length=256, response_length=64)
PROMPT = "<|im_start|>user\nAnswer it. Question: what is the capital of france?<|im_end|>\n<|im_start|>assistant\n"


async def test_generate_answers_within_the_budget_and_new_weights_reach_the_served_model(tiny_model):
    server = CpuRolloutServer(CONFIG, str(tiny_model), replica_rank=0, options={})
    prompt_ids = server.tokenizer.encode(PROMPT, add_special_tokens=False)
    params = {"max_tokens": 8, "temperature": 1.0, "logprobs": True}
    out = await server.generate(prompt_ids, params, "r1")
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)

    norm = server.model.state_dict()["model.norm.weight"]
    await server.update_weights({"model.norm.weight": torch.full_like(norm, 2.0)}, global_steps=1)
    assert torch.equal(server.model.state_dict()["model.norm.weight"], torch.full_like(norm, 2.0))
    assert (await server.generate(prompt_ids, params, "r2")).extra_fields["global_steps"] == 1
    with pytest.raises(KeyError, match="lacks"):
        await server.update_weights({"no.such.weight": norm}, global_steps=2)


def test_a_replica_runs_the_plain_server_unless_the_options_name_a_subclass_of_it():
    assert server_class(CpuRolloutOptions()) is CpuRolloutServer
    with pytest.raises(CpuRolloutConfigError, match="opening_policy: collections.Counter is not a CpuRolloutServer"):
        server_class(CpuRolloutOptions(opening_policy="collections.Counter"))
