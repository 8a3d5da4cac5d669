"""The ``zmq`` checkpoint engine: hands the trainer's weights to standalone rollout replicas over ZeroMQ (verl's
``separate_async`` mode on a machine without NCCL; verl's own engines all need an accelerator library).

Registered in verl's ``CheckpointEngineRegistry`` when imported (name this module in
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module``). One sync: the trainer's rank 0 binds a ROUTER
socket, receivers connect and say hello, every trainer rank iterates the weights (FSDP gathers are collective) while
rank 0 sends them in buckets and each receiver yields them; ``finalize`` closes the sockets.

Invariant: every receiver gets every tensor exactly once, in the trainer's order, as a CPU tensor; a sender or
receiver that waits past ``timeout_s`` raises :class:`WeightSyncTimeout` naming what it waited for.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import torch
import zmq
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from verl_search.errors import CpuBackendError, WeightSyncTimeout

BACKEND = "zmq"
HELLO = b"ready"
_END = b"end"
_BUCKET = b"bucket"


def _host_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().to("cpu", copy=True).contiguous()


@CheckpointEngineRegistry.register(BACKEND)
class ZmqCheckpointEngine(CheckpointEngine):
    """One sender (the trainer's rank 0) and any number of receivers (one per rollout worker)."""

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0, **_: Any) -> None:
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout_s = float(timeout_s)
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._receivers = 0
        self._role = "idle"

    def prepare(self) -> dict[str, Any]:
        """The sender binds its socket and returns its address; every other worker returns no address."""
        if not self.is_master:
            return {"address": None}
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        ip = _host_ip()
        port = self._socket.bind_to_random_port(f"tcp://{ip}")
        return {"address": f"tcp://{ip}:{port}"}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        addresses = [m["address"] for m in metadata[:actor_wg_world_size] if m and m.get("address")]
        if len(addresses) != 1:
            raise CpuBackendError(f"the {BACKEND} checkpoint engine needs one sender, found {len(addresses)}")

        def side(role: str, size: int) -> dict[str, list[Any]]:
            return {"role": [role] * size, "address": addresses * size, "receivers": [rollout_world_size] * size}

        return side("sender", actor_wg_world_size), side("receiver", rollout_world_size)

    def init_process_group(self, role: str, address: str, receivers: int) -> None:
        self._role = role
        self._receivers = int(receivers)
        if role == "receiver":
            self._context = zmq.Context()
            self._socket = self._context.socket(zmq.DEALER)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.connect(address)
            self._socket.send(HELLO)

    def finalize(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        self._socket = self._context = None
        self._role = "idle"

    def _poll(self, what: str) -> None:
        if not self._socket.poll(int(self.timeout_s * 1000), zmq.POLLIN):
            raise WeightSyncTimeout(f"{BACKEND} weight sync: no {what} within {self.timeout_s:g} s")

    def _await_receivers(self) -> list[bytes]:
        identities: list[bytes] = []
        while len(identities) < self._receivers:
            self._poll(f"hello from rollout worker {len(identities) + 1} of {self._receivers}")
            identity, message = self._socket.recv_multipart()
            if message == HELLO and identity not in identities:
                identities.append(identity)
        return identities

    def _broadcast(self, identities: list[bytes], kind: bytes, content: Any) -> None:
        payload = pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
        for identity in identities:
            self._socket.send_multipart([identity, kind, payload])

    async def send_weights(self, weights: Iterable, global_steps: int | None = None) -> dict[str, float]:
        """Every trainer rank consumes ``weights``; rank 0 sends them in buckets of ``bucket_size`` bytes."""
        sending = self.is_master and self._role == "sender"
        identities = await asyncio.to_thread(self._await_receivers) if sending else []
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in ensure_async_iterator(weights):
            cpu = _to_cpu(tensor)
            if not sending:
                continue
            bucket.append((name, cpu))
            size += cpu.numel() * cpu.element_size()
            if size >= self.bucket_size:
                await asyncio.to_thread(self._broadcast, identities, _BUCKET, bucket)
                bucket, size = [], 0
        if sending:
            if bucket:
                await asyncio.to_thread(self._broadcast, identities, _BUCKET, bucket)
            await asyncio.to_thread(self._broadcast, identities, _END, global_steps)
        return {}

    def _receive(self) -> tuple[bytes, bytes]:
        self._poll("weights from the trainer")
        kind, payload = self._socket.recv_multipart()
        return kind, payload

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield ``(name, tensor)`` in the trainer's order until the sender's end marker."""
        while True:
            kind, payload = await asyncio.to_thread(self._receive)
            if kind == _END:
                return
            for name, tensor in pickle.loads(payload):
                yield name, tensor
