"""Start and stop the retrieval fleet: connect to Ray, start Serve's proxy on the configured address, deploy the
application and wait until every replica is up; ``stop_fleet`` removes it.

Invariant: ``start_fleet`` returns only once the application is RUNNING and /health answers 200 through the proxy,
and raises a ServeSetupError naming the cause otherwise (it never waits past ``startup_timeout_s``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request

from pydantic import SecretStr

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.serve.errors import DeploymentFailed, RayUnreachable, ServeExtraMissing, ServeSetupError
from local_dense_retriever.serve.options import ServeOptions

logger = logging.getLogger(__name__)

POLL_S = 0.5


def import_serve():
    """``ray.serve``, or ServeExtraMissing with the install command."""
    try:
        from ray import serve
    except ImportError as e:
        raise ServeExtraMissing(
            f"Ray Serve is not installed ({e}): pip install 'verl-search[serve]' (or 'ray[serve]')"
        ) from e
    return serve


def private_serve_api(serve):
    """``(serve._run, proxy_address)``: the two private Serve entry points the fleet uses, checked before use
    (``proxy_address()``: ``(host, port)`` of the proxy Serve runs, once it runs).

    Why private: the public ``serve.run`` waits for the application without a deadline (replicas that wait for
    resources would hang the launch) and nothing public says where an already running proxy listens. A Ray release that
    renames or reshapes them fails here with one line instead of deep inside a deployment (a test checks the pinned
    Ray)."""
    import inspect

    try:
        from ray.serve._private.client import ServeControllerClient
        from ray.serve.context import _get_global_client

        run = serve._run
        accepted = set(inspect.signature(run).parameters)
    except (AttributeError, ImportError) as e:
        fix = "install the Ray of requirements/ or update local_dense_retriever/serve/fleet.py"
        problem = f"this Ray ({_ray_version()}) lacks a private Serve API the fleet uses ({e})"
        raise ServeSetupError(f"{problem}; {fix}") from e
    missing = sorted({"_blocking", "name", "route_prefix"} - accepted)
    if not hasattr(ServeControllerClient, "http_config"):
        missing.append("ServeControllerClient.http_config")
    if missing:
        raise ServeSetupError(f"this Ray ({_ray_version()}) changed the private Serve API the fleet uses (missing "
                              f"{', '.join(missing)}); install the Ray of requirements/ or update "
                              "local_dense_retriever/serve/fleet.py")  # fmt: skip

    def proxy_address() -> tuple[str, int]:
        http = _get_global_client().http_config
        return http.host, http.port

    return run, proxy_address


def _ray_version() -> str:
    import ray

    return f"ray {ray.__version__}"


def probe_address(address: str | None, timeout: float = 5.0) -> None:
    """Fail fast when nothing listens at a ``host:port`` (or ``ray://host:port``) address: ray.init would retry for
    minutes. ``auto``/``local``/None are left to ray.init (it answers at once when no cluster is found)."""
    if address in (None, "auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise RayUnreachable(f"--address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayUnreachable(f"no Ray cluster answers at {address}: {e.strerror or e} (start one with "
                             "`ray start --head`, or give the head's address)") from e  # fmt: skip


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (None: start a local instance), unless this process already has."""
    import ray

    if ray.is_initialized():
        return
    probe_address(address)
    # replicas on this node inherit it: idle OpenMP threads that spin stall torch on shared cores (see the CLI)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError) as e:
        where = address or "a new local instance"
        raise RayUnreachable(f"cannot reach a Ray cluster at {where}: {str(e).splitlines()[0]} (start one with "
                             "`ray start --head`, or give --address)") from e  # fmt: skip


def proxy_port(config: ServerConfig) -> int:
    """The proxy's port: ``config.port``, or for 0 one that was free a moment ago (Serve needs a number)."""
    if config.port:
        return config.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((config.host, 0))
        return s.getsockname()[1]


def url_for(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def _health(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def _cause(app_status) -> str:
    """The last line of the first failed deployment's message (a replica constructor's exception), else the app's."""
    for deployment in app_status.deployments.values():
        lines = [line for line in (deployment.message or "").strip().splitlines() if line.strip()]
        if deployment.status != "HEALTHY" and lines:
            return lines[-1].strip()
    lines = (app_status.message or "").strip().splitlines()
    return lines[-1].strip() if lines else "no cause given; see the Ray Serve logs"


def launcher_web_key(config: ServerConfig) -> SecretStr | None:
    """The web backend's API key from this (the launcher's) environment, for the replicas: those on other nodes do not
    share it. None unless the backend is web and its mode calls the provider; unset fails here, before any deploy."""
    if config.resolved_backend() != "web":
        return None
    from local_dense_retriever.web.backend import api_key
    from local_dense_retriever.web.errors import WebSetupError

    try:
        return api_key(config)
    except WebSetupError as e:
        raise ServeSetupError(str(e)) from e


def start_fleet(config: ServerConfig, options: ServeOptions, *, progress: bool = False) -> str:
    """Deploy the retriever as ``options`` say and return its one URL once it answers."""
    web_key = launcher_web_key(config)
    serve = import_serve()
    connect(options.address)
    from local_dense_retriever.serve.deployments import build_application
    from local_dense_retriever.toy.embedded_default import resolve_embedded_default

    # resolved once here, so replicas read the same files instead of each building the embedded default
    config = resolve_embedded_default(config, progress=progress)
    port = proxy_port(config)
    serve.start(http_options={"host": config.host, "port": port})
    serve_run, proxy_address = private_serve_api(serve)
    host, running_port = proxy_address()  # Serve already up in this cluster keeps its own proxy address
    if (host, running_port) != (config.host, port):
        logger.warning("Serve's proxy already listens on %s:%d in this cluster: the fleet is served there (its HTTP "
                       "address cannot change while Serve runs)", host, running_port)  # fmt: skip
        config = config.model_copy(update={"host": host, "port": running_port})
        port = running_port
    app = build_application(config, options, web_key)
    logger.info("deploying %r into Ray Serve", options.app_name)
    serve_run(app, name=options.app_name, route_prefix="/", _blocking=False)
    url = url_for(config.host, port)
    probe = f"http://{'127.0.0.1' if config.host in ('', '0.0.0.0', '::') else config.host}:{port}"
    deadline = time.monotonic() + options.startup_timeout_s
    status, detail = "", ""
    while time.monotonic() < deadline:
        app_status = serve.status().applications.get(options.app_name)
        status = app_status.status if app_status is not None else "NOT_STARTED"
        if status == "DEPLOY_FAILED":
            raise DeploymentFailed(f"Serve could not deploy {options.app_name!r}: {_cause(app_status)}")
        if status == "RUNNING":
            code, detail = _health(probe)
            if code == 200:
                logger.info("ready: %s", json.loads(detail).get("detail"))
                return url
        time.sleep(POLL_S)
    raise DeploymentFailed(f"{options.app_name!r} was not ready after {options.startup_timeout_s:g} s (status "
                           f"{status}; /health: {detail[:200]}); replicas may be waiting for resources")  # fmt: skip


def stop_fleet(options: ServeOptions) -> None:
    """Remove the application (the cluster and Serve stay up)."""
    serve = import_serve()
    serve.delete(options.app_name)
