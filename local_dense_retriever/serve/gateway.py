"""``Gateway``: the fleet's optional HTTP entry (``gateway_replicas``). It forwards every request to a retriever
replica, once more to another replica when the one serving it dies (/health and /metrics are the fleet's, answered
in front of it by ``FleetViewApp``).

Why a gateway: Serve's proxy answers 500 for a request whose replica died mid-flight, and a client must not retry a
500; retrieval is a read, so the gateway retries it, and only a second death becomes a 503 (which
clients do retry). Invariants: a client's request reaches a replica as it was sent (method, path, query, headers,
body), and the replica's app answers it with its own validation, limits and errors; every failure of the gateway
itself is an ``ErrorResponse`` JSON body; a client that hangs up cancels its request on the replica.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.errors import ClientDisconnected, RequestError
from local_dense_retriever.middleware import read_body, until_disconnect
from local_dense_retriever.serve.asgi_call import ForwardedRequest, ForwardedResponse
from local_dense_retriever.wire import error_answer, error_response, internal_error

logger = logging.getLogger(__name__)

#: a request is tried on this many replicas in all when the ones serving it die
ATTEMPTS = 2


@dataclass
class GatewayCounters:
    """What one gateway did (its part of the fleet's /metrics ``gateway``)."""

    forwarded_total: int = 0
    retried_total: int = 0  # a replica died serving the request; it went to another
    failed_after_retry_total: int = 0  # ... and that one died too: the client got a 503
    client_closed_total: int = 0


def replica_died(exc: BaseException) -> bool:
    """The replica serving a call died or became unreachable (Ray's actor errors, also when wrapped in a task
    error), as opposed to an error the replica's code raised."""
    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(exc, RayActorError):
        return True
    return isinstance(exc, RayTaskError) and isinstance(getattr(exc, "cause", None), RayActorError)


Forward = Callable[[ForwardedRequest], Awaitable[ForwardedResponse]]


async def forward_with_retry(forward: Forward, request: ForwardedRequest, counters: GatewayCounters) -> Any:
    """The replica's answer (a ForwardedResponse), or an error JSONResponse when none could give it."""
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    counters.forwarded_total += 1
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await forward(request)
        except BackPressureError as e:
            return error_response(429, "overloaded", f"every retriever replica is busy: {e}")
        except DeploymentUnavailableError as e:
            return error_response(503, "unavailable", f"no retriever replica is available: {e}")
        except Exception as e:  # noqa: BLE001 - sorted below: a dead replica is retried, anything else is a 500
            if not replica_died(e):
                return internal_error(f"forwarding {request.method} {request.path}", e)
            if attempt == ATTEMPTS:
                counters.failed_after_retry_total += 1
                logger.warning("gateway: %s %s: the retry's replica died too (%s)", request.method, request.path,
                               type(e).__name__)  # fmt: skip
                return error_response(503, "unavailable", f"the retriever replicas serving this request died "
                                      f"({ATTEMPTS} tried); retry shortly")  # fmt: skip
            counters.retried_total += 1
            logger.warning("gateway: the replica serving %s %s died (%s); retrying on another", request.method,
                           request.path, type(e).__name__)  # fmt: skip
    raise AssertionError("unreachable")


class GatewayApp:
    """The gateway's ASGI app: ``forward`` sends a request to one retriever replica (wrap it in a FleetViewApp for
    the fleet's /health and /metrics)."""

    def __init__(self, config: ServerConfig, forward: Forward) -> None:
        self.config, self.forward = config, forward
        self.counters = GatewayCounters()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        config = self.config
        try:
            body = await read_body(receive, config.max_body_bytes, config.body_timeout_s)
            request = ForwardedRequest(scope["method"], scope["path"], scope.get("query_string", b""),
                                       list(scope.get("headers", [])), body)  # fmt: skip
            answer = await until_disconnect(forward_with_retry(self.forward, request, self.counters), receive)
        except ClientDisconnected:
            self.counters.client_closed_total += 1
            return
        except RequestError as e:  # the body was too large or too slow
            await error_answer(e, "reading a body")(scope, receive, send)
            return
        if isinstance(answer, ForwardedResponse):
            await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
            await send({"type": "http.response.body", "body": answer.body})
        else:
            await answer(scope, receive, send)

    def report(self) -> dict:
        """What this gateway posts to the board."""
        return {"counters": asdict(self.counters)}


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
