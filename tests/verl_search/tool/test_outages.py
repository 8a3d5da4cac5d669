"""Long and repeated outages: bounded backoff arithmetic, one log line per state change, and an endpoint that crashes
and restarts on the same port is used again as soon as it answers (one outage counts once)."""

from __future__ import annotations

import asyncio
import logging

from cpu_bench.background_server import free_port
from cpu_bench.testing.stub_retriever import StubServer
from verl_search import SearchTool, search_stats
from verl_search.tool.client import RetrievalClient


async def test_an_endless_outage_stays_unavailable_and_logs_state_changes_only(stub, make_config, caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    # no rate limit: 1,100 calls need not wait for tokens (their 2 s deadline is the outage's, not the bucket's)
    config = make_config(retrieval_service_url=dead, max_attempts=1, eject_seconds=0.0, rate_limit=None)
    tool = SearchTool(config.model_dump())
    caplog.set_level(logging.DEBUG, logger="verl_search")
    kinds = set()
    for i in range(1100):  # past the 1,024 failed attempts after which 2 ** n overflowed
        _, _, metrics = await tool.execute("t", {"query_list": [f"q{i}"]})
        kinds.add(metrics["failure"])
    assert kinds == {"unavailable"}
    assert search_stats()["failures"] == {"unavailable": 1100}
    endpoint = RetrievalClient.shared(config).endpoints.endpoints[0]
    assert endpoint.consecutive_failures == 1100 and endpoint.ejections == 1
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and "is failing" in loud[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


async def test_a_restarted_endpoint_is_used_again_once_it_answers(make_config, stub_corpus):
    with StubServer(stub_corpus) as live:
        crashing = StubServer(stub_corpus).__enter__()
        port = crashing.port
        config = make_config(retrieval_service_url=[crashing.url, live.url], timeout=20.0, attempt_timeout=10.0)
        tool = SearchTool(config.model_dump())
        client = RetrievalClient.shared(config)
        endpoint = next(ep for ep in client.endpoints.endpoints if ep.url.startswith(crashing.url))

        # many requests in flight to one endpoint when it crashes: each one is cut off
        crashing.state.set_fault("slow", slow_seconds=30)
        calls = [asyncio.ensure_future(tool.execute("t", {"query_list": [f"q{i}"]})) for i in range(20)]
        while endpoint.in_flight < 5:
            await asyncio.sleep(0.01)
        cut_off = endpoint.in_flight
        await asyncio.to_thread(crashing.__exit__, None, None, None)
        results = await asyncio.gather(*calls)
        assert all(metrics["ok"] for _, _, metrics in results)  # failed over to the live endpoint
        # one outage, however many requests it cut off (a re-probe that fails while the port is closed, as on a
        # loaded machine after the ~1 s window, adds to the failures of the same outage, not a new one)
        assert endpoint.ejections == 1 and endpoint.down and endpoint.consecutive_failures < cut_off

        with StubServer(stub_corpus, port=port) as restarted:
            for i in range(500):  # calls keep coming; the restarted endpoint is re-probed after ~1 s, not 30 s
                await tool.execute("t", {"query_list": [f"after {i}"]})
                if restarted.state.requests:
                    break
                await asyncio.sleep(0.01)
            assert restarted.state.requests > 0
            assert endpoint.ejections == 1 and endpoint.consecutive_failures == 0 and not endpoint.down
