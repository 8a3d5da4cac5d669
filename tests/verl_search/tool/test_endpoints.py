"""Several retrieval endpoints: least-in-flight spreading, ejection, re-probing and failover within the deadline."""

from __future__ import annotations

import asyncio

from cpu_bench.background_server import free_port
from cpu_bench.testing.stub_retriever import StubServer
from verl_search import SearchTool
from verl_search.tool.limits import EndpointSet


def test_pick_prefers_fewest_in_flight_and_skips_ejected():
    eps = EndpointSet(["a", "b", "c"], eject_seconds=1.0, eject_max_seconds=8.0)
    a, b, c = eps.endpoints
    a.in_flight, b.in_flight, c.in_flight = 5, 1, 3
    assert eps.pick(now=0).url == "b"
    eps.failed(b, now=0)
    assert eps.pick(now=0.5).url == "c"
    assert eps.pick(now=1.5).url == "b"  # ejection over: re-probed


def test_ejection_doubles_per_failed_re_probe_and_resets_on_success():
    eps = EndpointSet(["a", "b"], eject_seconds=1.0, eject_max_seconds=3.0)
    a = eps.endpoints[0]
    now = 0.0
    for expected in (1.0, 2.0, 3.0, 3.0):
        assert eps.failed(a, now=now)
        assert a.ejected_until == now + expected
        now = a.ejected_until  # the next failure is a re-probe after the ejection ended
    eps.succeeded(a)
    assert a.ejected_until == 0
    assert a.ejections == 1 and a.consecutive_failures == 0


def test_one_outage_counts_once_however_many_requests_it_cuts_off():
    eps = EndpointSet(["a", "b"], eject_seconds=1.0, eject_max_seconds=30.0)
    a = eps.endpoints[0]
    # 120 requests sent at t=0..1 are all cut off by one crash at t=2
    assert eps.failed(a, now=2.0, started=0.0)
    assert not any(eps.failed(a, now=2.0 + i / 1000, started=i / 120) for i in range(1, 120))
    # one that was sent before the crash but times out after the ejection ended is still the same outage
    assert not eps.failed(a, now=12.0, started=1.5)
    assert (a.consecutive_failures, a.ejections, a.ejected_until) == (1, 1, 3.0)  # re-probed after ~1 s, not 30 s


def test_backoff_arithmetic_is_bounded_in_an_endless_outage():
    eps = EndpointSet(["a"], eject_seconds=1.0, eject_max_seconds=30.0)
    a = eps.endpoints[0]
    now = 0.0
    for _ in range(5000):  # 2 ** 1024 overflowed a float after 1,024 failed re-probes
        assert eps.failed(a, now=now)
        assert a.ejected_until - now <= 30.0
        now = a.ejected_until
    assert a.consecutive_failures == 5000 and a.ejections == 1


def test_all_ejected_still_probes_the_soonest_to_recover():
    eps = EndpointSet(["a", "b"], eject_seconds=1.0, eject_max_seconds=30.0)
    a, b = eps.endpoints
    eps.failed(a, now=0)
    eps.failed(a, now=1)
    eps.failed(b, now=1)
    assert eps.pick(now=1.1).url == "b"


def test_idle_endpoints_share_the_load():
    eps = EndpointSet(["a", "b", "c"], eject_seconds=1.0, eject_max_seconds=8.0)
    picked = [eps.pick(now=0).url for _ in range(30)]
    assert {u: picked.count(u) for u in "abc"} == {"a": 10, "b": 10, "c": 10}


async def test_calls_fail_over_from_a_dead_endpoint(make_config, stub_corpus):
    dead = f"http://127.0.0.1:{free_port()}"
    with StubServer(stub_corpus) as live:
        tool = SearchTool(make_config(retrieval_service_url=[dead, live.url], eject_seconds=30).model_dump())
        results = await asyncio.gather(*(tool.execute("t", {"query_list": [f"Paris {i}"]}) for i in range(20)))
        assert all(metrics["ok"] for _, _, metrics in results)
        assert live.state.requests == 20


async def test_load_spreads_over_live_endpoints(make_config, stub_corpus):
    with StubServer(stub_corpus) as one, StubServer(stub_corpus) as two:
        one.state.set_fault("slow", slow_seconds=0.2)
        two.state.set_fault("slow", slow_seconds=0.2)
        tool = SearchTool(make_config(retrieval_service_url=[one.url, two.url]).model_dump())
        results = await asyncio.gather(*(tool.execute("t", {"query_list": [f"q{i}"]}) for i in range(40)))
        assert all(metrics["ok"] for _, _, metrics in results)
        assert one.state.requests == two.state.requests == 20
