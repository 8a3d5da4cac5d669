"""Partial rollout (TRAINER=fully_async|one_step_off|colocate_async): a weight sync pauses generation mid-turn and
verl's ``FullyAsyncLLMServerClient`` resends the request with the tokens so far, to newer weights. Our agent loops and
tool path must come out of that token-exact, with their search statistics, and a search in flight when the pause comes
must be neither lost nor sent twice.

Real parts: verl's ``AgentLoopWorker`` and ``FullyAsyncLLMServerClient`` (its resume loop is what runs in training),
``search_r1_agent``, verl's ``tool_agent`` with ``SearchTool``, the HTTP stub retriever. The "model" is the scripted
policy behind a server that pauses like a rollout server does during a weight sync (``abort_all_requests``: the
unfinished request ends as ``aborted`` with its tokens so far; new requests wait for ``resume_generation``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from verl.workers.rollout.replica import TokenOutput

from cpu_bench.testing.scripted_policy import ScriptedServerManager, native_search_policy, tool_call_policy
from cpu_bench.testing.scripted_rollout import rollout_overrides, rows_to_batch, verl_trainer_config
from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir


class PausingServer:
    """A rollout server over a scripted policy that pauses like verl's engines during a weight sync.

    ``cut``: every turn's first attempt ends after ``cut`` tokens as ``aborted`` (a sync came mid-turn) and the
    weights move on one version; the resent request (prompt + those tokens) gets the rest. ``pause``/``resume``: new
    requests wait while paused; ``resume`` installs the next weight version.
    """

    def __init__(self, inner: ScriptedServerManager, cut: int | None = None) -> None:
        self.inner = inner
        self.cut = cut
        self.version = 0
        self.aborted = 0
        self.attempts = 0
        self._rest: dict[tuple[int, ...], TokenOutput] = {}
        self._open = asyncio.Event()
        self._open.set()

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self.version += 1
        self._open.set()

    def _out(self, tokens: list[int], log_probs: list[float] | None, reason: str, version: int) -> TokenOutput:
        return TokenOutput(
            token_ids=tokens, log_probs=log_probs, num_preempted=0, stop_reason=reason,
            extra_fields={"global_steps": version},
        )  # fmt: skip

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> TokenOutput:
        await self._open.wait()
        self.attempts += 1
        key = tuple(prompt_ids)
        if key in self._rest:  # the resent request: the rest of the turn, written by the newer weights
            rest = self._rest.pop(key)
            return self._out(list(rest.token_ids), rest.log_probs, "completed", self.version)
        full = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        tokens, log_probs = list(full.token_ids), full.log_probs
        if self.cut is None or len(tokens) <= self.cut:
            return self._out(tokens, log_probs, "completed", self.version)
        head, tail = tokens[: self.cut], tokens[self.cut :]
        self._rest[key + tuple(head)] = self._out(tail, log_probs[self.cut :] if log_probs else None, "completed", 0)
        self.aborted += 1
        self.version += 1  # the sync that paused this turn installs new weights
        return self._out(head, log_probs[: self.cut] if log_probs else None, "aborted", self.version - 1)


class OneServerBalancer:
    """verl's global load balancer for one server, called the way verl calls the Ray actor (``x.method.remote``)."""

    def __init__(self, server: PausingServer) -> None:
        handle = SimpleNamespace(generate=SimpleNamespace(remote=server.generate))
        self.require_acquire_fields = SimpleNamespace(remote=self._fields)
        self.require_release_fields = SimpleNamespace(remote=self._fields)
        self.acquire_server = SimpleNamespace(remote=lambda **kw: self._acquire(handle))
        self.release_server = SimpleNamespace(remote=lambda **kw: None)

    @staticmethod
    async def _fields() -> list[str]:
        return []

    @staticmethod
    async def _acquire(handle: Any) -> tuple[str, Any]:
        return "server-0", handle


async def roll_out(rows: list[dict], tool_yaml, policy, *, cut: int | None = None, during=None) -> tuple[Any, Any]:
    """``rows`` through verl's AgentLoopWorker with verl's FullyAsyncLLMServerClient over a PausingServer;
    ``during(server)`` runs beside the rollout (to pause and resume it)."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    tokenizer_dir = await asyncio.to_thread(ensure_tokenizer_dir)
    config = verl_trainer_config(
        rollout_overrides(model_path=tokenizer_dir, tool_config_path=tool_yaml, response_length=1024)
    )
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, tokenizer_dir)
    server = PausingServer(ScriptedServerManager(tokenizer, policy), cut=cut)
    client = FullyAsyncLLMServerClient(config, load_balancer_handle=OneServerBalancer(server))
    worker = await asyncio.to_thread(AgentLoopWorker, config, llm_client=client, reward_loop_worker_handles=None)
    rollout = asyncio.ensure_future(worker.generate_sequences(rows_to_batch(rows)))
    if during is not None:
        await during(server)
    return await rollout, server


@pytest.fixture
def uncached_tool_yaml(tool_yaml):
    """The tool YAML with the per-process result cache off, so every search the loops make reaches the retriever."""
    import yaml

    config = yaml.safe_load(tool_yaml.read_text())
    config["tools"][0]["config"]["cache_size"] = 0
    tool_yaml.write_text(yaml.safe_dump(config))
    return tool_yaml


TENSORS = ("prompts", "responses", "response_mask", "attention_mask", "rollout_log_probs")
STATS = ("search_calls", "search_failures", "invalid_actions", "__num_turns__")


def assert_same_trajectories(paused: Any, straight: Any) -> None:
    for key in TENSORS:
        assert torch.equal(paused.batch[key], straight.batch[key]), key
    for key in STATS:
        assert np.array_equal(paused.non_tensor_batch[key], straight.non_tensor_batch[key]), key


@pytest.mark.parametrize(
    ("agent", "make_policy"), [("search_r1_agent", native_search_policy), ("tool_agent", tool_call_policy)]
)
async def test_a_turn_paused_mid_generation_resumes_token_exact(
    retriever, uncached_tool_yaml, rows, oracle, agent, make_policy
):
    tool_yaml = uncached_tool_yaml
    batch = [rows(q, agent, i) for i, q in enumerate(("who wrote hamlet?", "what is the capital of france?"))]
    straight, _ = await roll_out(batch, tool_yaml, make_policy(oracle))
    straight_queries = list(retriever.queries)
    retriever.queries.clear()

    paused, server = await roll_out(batch, tool_yaml, make_policy(oracle), cut=3)

    assert server.aborted >= 2 * len(batch)  # every turn (a search turn, then an answer turn) was cut and resumed
    assert_same_trajectories(paused, straight)  # prompts, tokens, masks, log-probs and search stats unchanged
    assert sorted(retriever.queries) == sorted(straight_queries)  # one search per search turn, as without pauses
    assert list(paused.non_tensor_batch["search_calls"]) == [1, 1]
    # verl's off-policy accounting sees the trajectory span the weight versions the pauses installed
    assert all(hi > lo for lo, hi in zip(paused.non_tensor_batch["min_global_steps"],
                                         paused.non_tensor_batch["max_global_steps"], strict=True))  # fmt: skip
    assert set(straight.non_tensor_batch["max_global_steps"]) == {0}


@pytest.mark.parametrize(
    ("agent", "make_policy"), [("search_r1_agent", native_search_policy), ("tool_agent", tool_call_policy)]
)
async def test_a_search_in_flight_when_generation_pauses_is_kept_and_sent_once(
    retriever, uncached_tool_yaml, rows, oracle, agent, make_policy
):
    tool_yaml = uncached_tool_yaml
    batch = [rows("who wrote hamlet?", agent)]
    straight, _ = await roll_out(batch, tool_yaml, make_policy(oracle))
    retriever.queries.clear()
    retriever.server.state.set_fault("slow", count=1, slow_seconds=1.0)  # the search is in flight for a second

    async def pause_during_search(server: PausingServer) -> None:
        while not retriever.queries:  # the retriever has the query: the search is in flight
            await asyncio.sleep(0.01)
        server.pause()  # a weight sync starts while the tool call waits on the retriever
        await asyncio.sleep(1.5)  # the search ends during the pause; the next turn waits for the new weights
        assert server.attempts == 1
        server.resume()

    paused, server = await roll_out(batch, tool_yaml, make_policy(oracle), during=pause_during_search)

    assert retriever.queries == ["who wrote hamlet?"]  # sent once, never repeated after the resume
    assert_same_trajectories(paused, straight)  # its result is in the trajectory, exactly as without the pause
    assert paused.non_tensor_batch["search_calls"][0] == 1
    assert paused.non_tensor_batch["max_global_steps"][0] == 1  # the answer turn ran on the new weights
