"""The ``hf_cpu`` rollout backend for verl: a :class:`RolloutReplica` that starts one CPU rollout server per replica,
and the in-worker adapter (verl's ``BaseRollout``) that forwards the actor's weights to it each step (from the
trainer's workers, or from a checkpoint engine in a standalone replica's worker).

Invariant: every trainer rank consumes the weight generator (FSDP gathers are collective), and only each replica's
rank 0 sends the gathered tensors to its server.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from verl_search.cpu.options import BACKEND_NAME, CpuRolloutOptions, resolve
from verl_search.cpu.rollout_server import CpuRolloutServer
from verl_search.errors import CpuRolloutConfigError

logger = logging.getLogger(__name__)


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    return f"verl_search_{BACKEND_NAME}_server_{replica_rank}{name_suffix}"


def server_class(options: CpuRolloutOptions) -> type[CpuRolloutServer]:
    """The server each replica runs: :class:`CpuRolloutServer`, or the subclass ``opening_policy`` names (tests)."""
    if options.opening_policy is None:
        return CpuRolloutServer
    path = options.opening_policy["path"]
    found = resolve(path)
    if not (isinstance(found, type) and issubclass(found, CpuRolloutServer)):
        raise CpuRolloutConfigError(
            f"actor_rollout_ref.rollout.engine_kwargs.{BACKEND_NAME}.opening_policy: {path} is not a "
            "CpuRolloutServer subclass"
        )
    return found


def _replica_world_size(config: Any) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


class CpuRolloutReplica(RolloutReplica):
    """One transformers server per replica, in its own Ray actor (no accelerator), named for the adapter to find."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(
                f"the {BACKEND_NAME} rollout serves one rank per replica: set tensor_model_parallel_size=1"
            )
        options = CpuRolloutOptions.from_engine_kwargs(self.config.engine_kwargs)
        name = server_actor_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(server_class(options))
            .options(name=name, max_concurrency=self.max_concurrency, num_cpus=0)
            .remote(
                config=self.config,
                model_path=str(self.model_config.path),
                replica_rank=self.replica_rank,
                options=options.model_dump(),
                trust_remote_code=bool(self.model_config.get("trust_remote_code", False)),
            )
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    def rollout_worker_use_gpu(self) -> bool:
        return False


class CpuServerAdapter(BaseRollout):
    """Lives in each trainer worker; hands the actor's weights to its replica's server (checkpoint engine ``naive``)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = _replica_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_leader_rank = rank % world == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None  # nothing is released on a CPU

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Iterable, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the {BACKEND_NAME} rollout takes full named tensors, not {wire_format!r}")
        start = time.perf_counter()
        from verl.workers.rollout.utils import ensure_async_iterator

        tensors: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            tensors[name] = full.detach().to("cpu", copy=True)
        if not self.is_leader_rank:
            return
        reply = await self._server_handle().update_weights.remote(tensors, kwargs.get("global_steps"))
        logger.info(
            "weights to the %s server: %d tensors in %.3f s (server copy %.3f s)",
            BACKEND_NAME,
            len(tensors),
            time.perf_counter() - start,
            reply["seconds"],
        )
