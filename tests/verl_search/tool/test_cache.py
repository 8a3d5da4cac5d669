"""Per-process result cache: GRPO's repeated queries reach the retriever once; identical in-flight queries coalesce."""

from __future__ import annotations

import asyncio

import pytest

from verl_search import SearchTool, search_stats
from verl_search.tool.cache import LRUCache
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.search_tool import run_search


async def test_repeated_query_is_served_from_the_cache(stub, make_config):
    tool = SearchTool(make_config().model_dump())
    first, _, m1 = await tool.execute("a", {"query_list": ["Paris"]})
    second, _, m2 = await tool.execute("b", {"query_list": ["  Paris \n"]})  # same after whitespace normalisation
    assert first.text == second.text
    assert (m1["cached"], m2["cached"]) == (0, 1) and m2["joined"] == 0  # from the cache, not a call in flight
    assert stub.state.requests == 1
    assert search_stats()["cache_hits"] == 1


async def test_only_missing_queries_are_sent(stub, make_config):
    tool = SearchTool(make_config().model_dump())
    await tool.execute("a", {"query_list": ["Paris"]})
    await tool.execute("b", {"query_list": ["Paris", "Danube"]})
    assert stub.state.queries == ["Paris", "Danube"]


async def test_topk_is_part_of_the_key(stub, make_config):
    await SearchTool(make_config(topk=1).model_dump()).execute("a", {"query_list": ["Paris"]})
    response, _, _ = await SearchTool(make_config(topk=2).model_dump()).execute("b", {"query_list": ["Paris"]})
    assert stub.state.requests == 2
    assert "Doc 2(" in response.text


async def test_identical_queries_in_flight_are_coalesced(stub, make_config):
    stub.state.set_fault("slow", slow_seconds=0.3)
    tool = SearchTool(make_config().model_dump())
    results = await asyncio.gather(*(tool.execute(f"g{i}", {"query_list": ["Danube"]}) for i in range(5)))
    assert stub.state.requests == 1
    assert len({r.text for r, _, _ in results}) == 1
    assert search_stats()["coalesced"] == 4
    # each call says whether it joined another: what search/joined_share adds up per training step
    assert sorted(m["joined"] for _, _, m in results) == sorted(m["cached"] for _, _, m in results) == [0, 1, 1, 1, 1]


async def test_failures_are_not_cached(stub, make_config):
    tool = SearchTool(make_config().model_dump())
    stub.state.set_fault("500", count=1)
    _, failed, _ = await tool.execute("a", {"query_list": ["Paris"]})
    response, _, metrics = await tool.execute("b", {"query_list": ["Paris"]})
    assert metrics["ok"] is True and stub.state.requests == 2


async def test_cache_off_sends_every_query(stub, make_config):
    tool = SearchTool(make_config(cache_size=0).model_dump())
    for _ in range(3):
        await tool.execute("a", {"query_list": ["Paris"]})
    assert stub.state.requests == 3


def test_lru_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put(("a", 3), [])
    cache.put(("b", 3), [])
    assert cache.get(("a", 3)) == []
    cache.put(("c", 3), [])
    assert cache.get(("b", 3)) is None and cache.get(("a", 3)) == [] and len(cache) == 2


def test_cache_is_bounded_in_bytes_evicting_least_recently_used():
    from verl_search.protocol import Document
    from verl_search.tool.cache import entry_bytes

    docs = [Document(id=str(i), contents='"T"\n' + "w" * 1500) for i in range(3)]  # ~4.8 KB, as wiki-18 hits
    one = entry_bytes(("q000", 3), docs)
    assert one > 4500
    cache = LRUCache(size=1_000_000, max_bytes=10 * one)
    for i in range(1000):
        cache.put((f"q{i:03d}", 3), docs)
        if i == 995:
            assert cache.get(("q990", 3)) is not None  # used recently: survives the next puts
    assert cache.bytes <= 10 * one and len(cache) == 10
    assert cache.get(("q990", 3)) is not None and cache.get(("q989", 3)) is None
    assert cache.get(("q999", 3)) is not None


def test_an_entry_larger_than_the_byte_bound_is_not_stored():
    from verl_search.protocol import Document

    cache = LRUCache(size=10, max_bytes=1000)
    cache.put(("big", 3), [Document(id="0", contents="x" * 5000)])
    assert len(cache) == 0 and cache.bytes == 0


async def test_the_tools_cache_keeps_to_cache_max_bytes(stub, make_config):
    tool = SearchTool(make_config(cache_max_bytes=20_000).model_dump())
    for i in range(200):
        await tool.execute("t", {"query_list": [f"Paris question {i}"]})
    from verl_search.tool.client import RetrievalClient

    cache = RetrievalClient.shared(make_config(cache_max_bytes=20_000)).cache
    assert 0 < cache.bytes <= 20_000 and 0 < len(cache) < 200


def test_a_cache_hit_under_uvloop_records_its_own_latency(stub):
    """An agent-loop worker may run uvloop, whose loop clock moves in whole milliseconds and only between iterations:
    a call answered from the cache never waits, so it recorded 0.0 s there, and a step where half the calls hit the
    cache logged a search latency p50 of 0 (found by CI in the CPU trainer test)."""
    uvloop = pytest.importorskip("uvloop")
    config = SearchToolConfig.from_dict({"retrieval_service_url": stub.url, "timeout": 2.0})

    async def twice():
        try:
            return [await run_search(config, ["Paris"]) for _ in range(2)]
        finally:
            await RetrievalClient.close_all()

    first, second = uvloop.run(twice())
    assert (first.cached, second.cached) == (0, 1)
    assert first.latency_s > 0 and second.latency_s > 0
