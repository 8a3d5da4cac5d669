"""The CPU rollout server: without an opening policy it does no work for one (no decode, no fingerprint); with the
test kit's policy the output opens with the forced text and the server's events, weight fingerprints included, are
recorded."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from cpu_bench.testing.forced_prefix import POLICY_PATH
from verl_search.cpu.rollout_server import CpuRolloutServer

CONFIG = SimpleNamespace(max_model_len=512, prompt_length=256, response_length=64)
PROMPT = "<|im_start|>user\nAnswer it. Question: what is the capital of france?<|im_end|>\n<|im_start|>assistant\n"


class DecodeCounter:
    """Wraps the server's tokenizer ``decode`` and counts the calls."""

    def __init__(self, decode):
        self.decode, self.calls = decode, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.decode(*args, **kwargs)


async def test_without_a_policy_prompts_are_not_decoded_and_nothing_is_forced(tiny_model):
    server = CpuRolloutServer(CONFIG, str(tiny_model), replica_rank=0, options={})
    assert server.opening_policy is None
    counter = DecodeCounter(server.tokenizer.decode)
    server.tokenizer.decode = counter
    prompt_ids = server.tokenizer.encode(PROMPT, add_special_tokens=False)
    out = await server.generate(prompt_ids, {"max_tokens": 8, "temperature": 1.0, "logprobs": True}, "r1")
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    assert counter.calls == 0
    reply = await server.update_weights({}, global_steps=1)
    assert reply["fingerprint"] is None


async def test_the_policy_forces_the_opening_and_records_the_servers_events(tiny_model, tmp_path):
    policy = {"path": POLICY_PATH, "search_every": 1, "record_dir": str(tmp_path)}
    server = CpuRolloutServer(CONFIG, str(tiny_model), replica_rank=0, options={"opening_policy": policy})
    prompt_ids = server.tokenizer.encode(PROMPT, add_special_tokens=False)
    forced = server.tokenizer.encode("<search> what is the capital of france? </search>", add_special_tokens=False)
    out = await server.generate(prompt_ids, {"max_tokens": len(forced) + 4, "temperature": 1.0}, "r1")
    assert out.token_ids[: len(forced)] == forced

    norm = server.model.state_dict()["model.norm.weight"]
    await server.update_weights({"model.norm.weight": torch.full_like(norm, 2.0)}, global_steps=1)
    (path,) = tmp_path.glob("server-0-*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "generate", "update_weights"]
    assert events[1]["forced"] == len(forced) and events[1]["request_id"] == "r1"
    assert events[0]["fingerprint"] != events[2]["fingerprint"] and events[2]["global_steps"] == 1
