"""The CPU pieces of the async trainers: the ``hf_cpu`` server pauses and resumes like verl's engines during a weight
sync (so verl's ``FullyAsyncLLMServerClient`` resumes a turn token-exact), and the ``zmq`` checkpoint engine hands
every tensor to every standalone rollout worker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cpu_bench.testing.scripted_rollout import verl_trainer_config
from verl_search.cpu.checkpoint_engine import ZmqCheckpointEngine
from verl_search.cpu.rollout_server import CpuRolloutServer
from verl_search.errors import WeightSyncTimeout


class OneServerBalancer:
    """verl's global load balancer for one in-process server, called the way verl calls the Ray actor."""

    def __init__(self, server: Any) -> None:
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


@pytest.fixture
def config(tiny_model):
    return verl_trainer_config(
        [
            f"actor_rollout_ref.model.path={tiny_model}",
            "actor_rollout_ref.rollout.name=hf_cpu",
            "actor_rollout_ref.rollout.prompt_length=64",
            "actor_rollout_ref.rollout.response_length=160",
        ]
    )


def server_of(config: Any, tiny_model) -> CpuRolloutServer:
    return CpuRolloutServer(config.actor_rollout_ref.rollout, str(tiny_model), 0, {"batch_window_ms": 0})


GREEDY = {"temperature": 0.0, "ignore_eos": True, "logprobs": True, "max_tokens": 160}


async def test_a_weight_sync_mid_turn_resumes_the_turn_token_exact(config, tiny_model):
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    prompt = list(range(5, 25))
    server = server_of(config, tiny_model)
    weights = {k: v.clone() for k, v in server.model.state_dict().items()}
    await server.update_weights(weights, global_steps=0)
    client = FullyAsyncLLMServerClient(config, load_balancer_handle=OneServerBalancer(server))
    straight = await client.generate("a", prompt_ids=prompt, sampling_params=dict(GREEDY))

    async def sync_weights_mid_turn() -> None:
        while not server._abort.is_set() and server._loop_task is None:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the turn is being generated
        await server.abort_all_requests()  # verl's checkpoint manager: abort, update the weights, resume
        await server.update_weights(weights, global_steps=1)  # same values: the output must not change
        await server.resume_generation()

    paused, _ = await asyncio.gather(
        client.generate("b", prompt_ids=prompt, sampling_params=dict(GREEDY)), sync_weights_mid_turn()
    )
    assert paused.token_ids == straight.token_ids and len(paused.token_ids) == 160
    assert paused.log_probs == pytest.approx(straight.log_probs, abs=1e-4)
    assert paused.extra_fields["min_global_steps"] == 0 and paused.extra_fields["max_global_steps"] == 1


async def test_a_paused_server_holds_new_requests_until_resumed_or_rejects_them(config, tiny_model):
    server = server_of(config, tiny_model)
    await server.abort_all_requests()
    waiting = asyncio.ensure_future(server.generate([5, 6, 7], {"max_tokens": 4}, "r"))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # held during the sync, not failed and not aborted
    await server.resume_generation()
    assert len((await waiting).token_ids) == 4
    await server.abort_all_requests(reject_request=True)
    with pytest.raises(RuntimeError, match="paused and rejects new requests"):
        await server.generate([5, 6, 7], {"max_tokens": 4}, "r")


def _sender_and_receivers(n: int, bucket: int = 64, timeout_s: float = 30.0) -> tuple[Any, list[Any]]:
    sender = ZmqCheckpointEngine(bucket_size=bucket, is_master=True, timeout_s=timeout_s)
    others = [ZmqCheckpointEngine(bucket_size=bucket, timeout_s=timeout_s) for _ in range(n + 1)]
    actor_ranks, receivers = [sender, others[0]], others[1:]  # two trainer ranks, n rollout workers
    metadata = [engine.prepare() for engine in actor_ranks + receivers]
    actor_kwargs, rollout_kwargs = ZmqCheckpointEngine.build_topology(len(actor_ranks), n, metadata)
    for i, engine in enumerate(actor_ranks):
        engine.init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})
    for i, engine in enumerate(receivers):
        engine.init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})
    return actor_ranks, receivers


async def test_zmq_checkpoint_engine_gives_every_rollout_worker_every_tensor_once():
    weights = {f"layer.{i}.weight": torch.randn(7, 5 + i) for i in range(6)}
    actor_ranks, receivers = _sender_and_receivers(2)

    async def receive(engine: ZmqCheckpointEngine) -> list[tuple[str, torch.Tensor]]:
        return [item async for item in engine.receive_weights(global_steps=3)]

    results = await asyncio.gather(
        *(rank.send_weights(iter(weights.items()), global_steps=3) for rank in actor_ranks),
        *(receive(engine) for engine in receivers),
    )
    for got in results[len(actor_ranks) :]:
        assert [name for name, _ in got] == list(weights)
        assert all(torch.equal(tensor, weights[name]) for name, tensor in got)
    for engine in actor_ranks + receivers:
        engine.finalize()


async def test_a_rollout_worker_without_a_sender_times_out_naming_what_it_waited_for():
    actor_ranks, receivers = _sender_and_receivers(1, timeout_s=0.3)
    with pytest.raises(WeightSyncTimeout, match="no weights from the trainer within 0.3 s"):
        [item async for item in receivers[0].receive_weights()]
    for engine in actor_ranks + receivers:
        engine.finalize()
