"""The Serve deployments: ``Retriever`` (the existing FastAPI app over a loaded engine, one per replica; in sharded
mode its index is the fan-out over ``Shard`` deployments) and ``build_application`` that wires them from the configs.

Invariant: a replica takes traffic only once its engine is loaded (the constructor loads it), so the proxy never
routes a request to a replica that would answer 'loading'; the wire protocol, /health and /metrics are the app's own.
"""

from __future__ import annotations

import asyncio
import logging

from ray import serve
from ray.serve.handle import DeploymentHandle

from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import load_engine
from local_dense_retriever.serve.options import ServeOptions
from local_dense_retriever.serve.shards import ShardedIndex, ShardSearcher, check_shardable

logger = logging.getLogger(__name__)


@serve.ingress()
class Retriever:
    """One replica of the retrieval service."""

    async def __init__(self, config: ServerConfig, shards: list[DeploymentHandle] | None = None) -> None:
        self.config = config

        def load():
            index = ShardedIndex(shards) if shards else None
            return load_engine(config, progress=False, index=index)

        self.engine = await asyncio.to_thread(load)

    def __serve_build_asgi_app__(self):
        self._service = create_app(self.config, engine=self.engine)
        return self._service

    def check_health(self) -> None:
        """Serve replaces a replica whose check raises (or does not answer within its timeout, as a replica whose
        event loop is blocked cannot): one whose batcher can no longer take requests, or that its watchdog sees
        stuck."""
        service = self._service.state.service
        if not service.healthy:
            raise RuntimeError(f"retriever replica unhealthy: {service.watchdog.problem or 'batching worker stopped'}")


class Shard(ShardSearcher):
    """One shard of the flat index as a Serve deployment (methods are called through handles, not HTTP)."""


def build_application(config: ServerConfig, options: ServeOptions):
    """The Serve application for ``config`` (paths already resolved: the embedded default prepared) and ``options``."""
    per_replica = {
        "ray_actor_options": options.actor_options(),
        "max_ongoing_requests": options.max_ongoing_requests,
        "health_check_period_s": 5,
    }
    if options.replicas_per_node is not None:
        per_replica["max_replicas_per_node"] = options.replicas_per_node
    shards = None
    if options.shards > 1:
        check_shardable(config, options.shards)
        shard_deployment = serve.deployment(Shard)
        shards = [
            shard_deployment.options(name=f"Shard{i}", num_replicas=options.shard_replicas, **per_replica).bind(
                config, i, options.shards
            )
            for i in range(options.shards)
        ]
    retriever = serve.deployment(Retriever).options(name="Retriever", **options.scaling(), **per_replica)
    return retriever.bind(config, shards)
