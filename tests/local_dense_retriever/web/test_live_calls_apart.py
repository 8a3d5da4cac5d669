"""A live call that hangs holds up only the request holding its query: cache hits and other live calls are answered
meanwhile, within a bound far below the hanging call's deadline (``--web_timeout_s``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

#: far longer than any answer here takes, far shorter than the hanging call's deadline
BOUND_S = 30.0


def ask(url: str, queries: list[str], timeout: float = BOUND_S) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 2}, timeout=timeout)


def sent(provider) -> list[str]:
    """The queries the stub has received so far."""
    return [r["json"]["q"] for r in list(provider.requests)]


def test_cached_and_fresh_queries_are_answered_while_a_live_call_hangs(provider, web_server, fault):
    url, _ = web_server(web_timeout_s=600.0, web_max_attempts=1)
    assert ask(url, ["cached query"]).status_code == 200
    release = threading.Event()
    provider.plan.append(fault(until=release))
    try:
        with ThreadPoolExecutor(2) as pool:
            hanging = pool.submit(ask, url, ["hanging query"], 300)
            stuck_with_it = pool.submit(ask, url, ["hanging query", "its request-mate"], 300)
            deadline = time.monotonic() + BOUND_S
            while "hanging query" not in sent(provider) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sent(provider).count("hanging query") == 1  # the hanging call is in flight, once
            answers = [ask(url, ["cached query"]), ask(url, ["fresh query"]), ask(url, ["cached query", "another"])]
            assert [a.status_code for a in answers] == [200, 200, 200]
            assert not hanging.done() and not stuck_with_it.done()  # only the requests holding the query wait
            release.set()
            assert hanging.result().status_code == 200 and stuck_with_it.result().status_code == 200
    finally:
        release.set()
    assert len(provider.requests) == 5  # the two requests asking the hanging query shared its one call
