"""The Serve deployments: ``Retriever`` (the existing FastAPI app over a loaded engine, one per replica; in sharded
mode its index is the fan-out over ``Shard`` deployments), the ``FleetBoard`` they report to, the optional
``Gateway`` in front of them, and ``build_application`` that wires them from the configs.

Invariant: a replica takes traffic only once its engine is loaded (the constructor loads it), so no request is
routed to a replica that would answer 'loading'; the wire protocol is the app's own, and /health and /metrics keep
the single server's shape with the fleet's totals, whichever deployment answers them.
"""

from __future__ import annotations

import asyncio
import logging
import os

from pydantic import SecretStr
from ray import serve
from ray.serve.handle import DeploymentHandle

from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.engine import load_engine
from local_dense_retriever.serve.asgi_call import ForwardedRequest, ForwardedResponse, call_asgi
from local_dense_retriever.serve.board import FleetBoard, post_forever
from local_dense_retriever.serve.fleet_view import FleetViewApp
from local_dense_retriever.serve.gateway import GatewayApp
from local_dense_retriever.serve.options import ServeOptions
from local_dense_retriever.serve.shards import ShardedIndex, ShardSearcher, check_shardable
from local_dense_retriever.service_state import ServiceState, health_report

logger = logging.getLogger(__name__)


def replica_report(state: ServiceState) -> dict:
    """What one server of a fleet tells the others: its /health body, whether it is healthy, its /metrics body."""
    return {"health": health_report(state), "healthy": state.healthy, "metrics": state.metrics_report()}


async def _load(config: ServerConfig, shards: list[DeploymentHandle] | None, web_key: SecretStr | None):
    if web_key is not None:  # the launcher's web API key: a replica on another node lacks the launcher's environment
        from local_dense_retriever.web.backend import api_key_env

        os.environ[api_key_env(config)] = web_key.get_secret_value()

    def load():
        index = ShardedIndex(shards) if shards else None
        return load_engine(config, progress=False, index=index)

    return await asyncio.to_thread(load)


class Retriever:
    """One replica of the retrieval service behind the gateway: its app serves the requests the gateway forwards
    (``forward``), and it posts its /health and /metrics to the board. It runs the app's lifespan itself (an
    application has one ingress: the gateway)."""

    async def __init__(self, config: ServerConfig, shards: list[DeploymentHandle] | None, board: DeploymentHandle,
                       web_key: SecretStr | None = None) -> None:  # fmt: skip
        self.config = config
        self.engine = await _load(config, shards, web_key)
        self._service = create_app(config, engine=self.engine)
        self._lifespan = self._service.router.lifespan_context(self._service)
        await self._lifespan.__aenter__()
        self._post_reports(board)

    def _post_reports(self, board: DeploymentHandle) -> None:
        self.name = serve.get_replica_context().replica_tag
        self._reporter = asyncio.get_running_loop().create_task(
            post_forever(board, "retriever", self.name, self.report)
        )

    async def forward(self, request: ForwardedRequest) -> ForwardedResponse:
        """A request the gateway forwards, answered by this replica's app as if it had come over HTTP."""
        return await call_asgi(self._service, request)

    def report(self) -> dict:
        """What this replica posts to the board: its /health body, whether it is healthy, its /metrics body."""
        return replica_report(self._service.state.service)

    def check_health(self) -> None:
        """Serve replaces a replica whose check raises (or does not answer within its timeout, as a replica whose
        event loop is blocked cannot): one whose batcher can no longer take requests, or that its watchdog sees
        stuck."""
        service = self._service.state.service
        if not service.healthy:
            problem = service.watchdog.current_problem() or "batching worker stopped"
            raise RuntimeError(f"retriever replica unhealthy: {problem}")

    async def __del__(self) -> None:
        self._reporter.cancel()
        await self._lifespan.__aexit__(None, None, None)


@serve.ingress()
class IngressRetriever(Retriever):
    """A replica that takes HTTP itself (``gateway_replicas=0``, the default): Serve runs its app and the app's
    lifespan; /health and /metrics answer for the fleet (from the board and this replica's own live report)."""

    async def __init__(self, config: ServerConfig, shards: list[DeploymentHandle] | None, board: DeploymentHandle,
                       web_key: SecretStr | None = None) -> None:  # fmt: skip
        self.config = config
        self.engine = await _load(config, shards, web_key)
        self._board = board
        self._post_reports(board)

    def __serve_build_asgi_app__(self):
        self._service = create_app(self.config, engine=self.engine)
        live = lambda: {"retriever": {self.name: self.report()}}  # noqa: E731
        return FleetViewApp(self._service, self._board.read.remote, live)

    def report(self) -> dict | None:
        return None if getattr(self, "_service", None) is None else super().report()

    async def __del__(self) -> None:  # Serve ends the app's lifespan itself
        self._reporter.cancel()


@serve.ingress()
class Gateway:
    """The fleet's HTTP entry when ``gateway_replicas`` > 0 (see local_dense_retriever.serve.gateway)."""

    async def __init__(self, config: ServerConfig, retriever: DeploymentHandle, board: DeploymentHandle) -> None:
        name = serve.get_replica_context().replica_tag
        self._gateway = GatewayApp(config, retriever.forward.remote)
        self._app = FleetViewApp(self._gateway, board.read.remote, lambda: {"gateway": {name: self._gateway.report()}})
        self._reporter = asyncio.get_running_loop().create_task(
            post_forever(board, "gateway", name, self._gateway.report)
        )

    def __serve_build_asgi_app__(self):
        return self._app


class Shard(ShardSearcher):
    """One shard of the flat index as a Serve deployment (methods are called through handles, not HTTP)."""


def build_application(config: ServerConfig, options: ServeOptions, web_key: SecretStr | None = None):
    """The Serve application for ``config`` (paths already resolved: the embedded default prepared) and ``options``;
    ``web_key`` is the web backend's API key read by the launcher, handed to every replica."""
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
    replica_options = {"name": "Retriever", **options.scaling(), **per_replica}
    # the board and the gateways only pass messages: they reserve no CPU, so they never wait for the replicas' cores
    board = (
        serve.deployment(FleetBoard)
        .options(
            name="FleetBoard", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=GATEWAY_ONGOING
        )
        .bind()
    )
    if options.gateway_replicas == 0:  # the replicas take HTTP themselves
        return serve.deployment(IngressRetriever).options(**replica_options).bind(config, shards, board, web_key)
    retriever = serve.deployment(Retriever).options(**replica_options).bind(config, shards, board, web_key)
    gateway = serve.deployment(Gateway).options(
        name="Gateway",
        num_replicas=options.gateway_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=GATEWAY_ONGOING,
        health_check_period_s=5,
    )
    return gateway.bind(config, retriever, board)


#: requests a gateway (or the board) holds at once: they wait on the replicas, whose own limit is what queues
GATEWAY_ONGOING = 100_000
