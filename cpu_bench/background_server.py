"""BackgroundServer: run an ASGI app under a real uvicorn server in a thread, on 127.0.0.1 and an ephemeral port.

Used by tests, the demo and benchmarks. Invariant: ``__enter__`` returns only once the server accepts connections,
and ``__exit__`` stops it and joins the thread.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for servers that must be started by port number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        startup_timeout: float = 30.0,
        **uvicorn_kwargs: Any,
    ) -> None:
        import uvicorn

        self.host = host
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self._sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", **uvicorn_kwargs)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {self._startup_timeout:g} s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def wait_until_healthy(url: str, process: subprocess.Popen, *, timeout: float = 300.0, what: str = "server") -> None:
    """Poll ``url``/health until it answers 200; raise ``RuntimeError`` if ``process`` exits or time runs out."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the {what} exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the {what} was not ready after {timeout:g} s")


def poll_json(url: str, until: Callable[[Any], bool], *, timeout: float = 20.0) -> Any:
    """GET ``url``'s JSON body until ``until(body)`` holds or ``timeout`` seconds pass; the last body either way (for a
    server whose figures settle a moment after the request that changed them, e.g. a fleet's reports)."""
    import httpx  # a test dependency: only tests poll

    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(url, timeout=10).json()
        if until(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.25)
