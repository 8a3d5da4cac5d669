"""AccessTool against the real retrieval service: a page read window by window, a url nobody serves, bad arguments,
the page cache, joined identical calls, failures labelled, failover between endpoints and the metrics of each call."""

from __future__ import annotations

import asyncio

import pytest

from cpu_bench.background_server import free_port
from verl_search import AccessTool, access_stats
from verl_search.tool.access_client import AccessClient
from verl_search.tool.config import AccessToolConfig

WIKI = "https://en.wikipedia.org/wiki/"  # the conftest's pages are Wikipedia's
WALKER = WIKI + "Paul_Walker"


async def read(config: dict, arguments) -> tuple[str, dict]:
    tool = AccessTool(config)
    instance_id, _ = await tool.create()
    response, reward, metrics = await tool.execute(instance_id, arguments)
    await tool.release(instance_id)
    assert reward == 0.0
    return response.text, metrics


def body_of(window: str) -> str:
    """A window's page text: without its header line and its next-window hint."""
    text = window.split("\n", 1)[1]
    return text.rsplit("\n[", 1)[0] if "more window(s); read the next with access" in text else text


async def test_a_long_page_is_read_window_by_window_to_its_end(pages_server, access_config, served):
    config = access_config()
    first, metrics = await read(config, {"url": WALKER})
    total = metrics["access/windows"]
    assert total >= 3 and first.startswith(f"[page 1 of {total}] Paul Walker\n")
    assert first.startswith(f"[page 1 of {total}] Paul Walker\n{served.paragraphs[0]}")
    assert first.endswith(f'read the next with access {{"url": "{WALKER}", "page": 2}}]')
    windows = [first]
    for page in range(2, total + 1):  # what a model does: the call each window names
        text, metrics = await read(config, {"url": WALKER, "page": page})
        assert metrics["ok"] and text.startswith(f"[page {page} of {total}] Paul Walker\n")
        windows.append(text)
    middle, last = windows[1], windows[-1]
    assert middle.endswith(f'{{"url": "{WALKER}", "page": 3}}]')
    assert "read the next" not in last and last.endswith(served.paragraphs[-1])
    assert all(len(w) <= 1000 for w in windows)  # the tool's cap, header and hint included
    # the windows hold the whole text, in order, each cut between paragraphs
    bodies = [body_of(w) for w in windows]
    assert "\n\n".join(bodies) == served.pages[0]["contents"]
    assert all(set(b.split("\n\n")) <= set(served.paragraphs) for b in bodies)
    assert pages_server.pages.reads == 1  # one request: the other windows came from the cache


async def test_a_page_past_the_last_names_how_many_windows_there_are(pages_server, access_config):
    _, metrics = await read(access_config(), {"url": WALKER})
    total = metrics["access/windows"]
    text, metrics = await read(access_config(), {"url": WALKER, "page": total + 1})
    assert text.startswith("[access error: invalid arguments] ")
    assert f"page {total + 1} is past the end: this url has {total} window(s)" in text
    assert metrics["ok"] is False and metrics["failure"] == "invalid_arguments"


async def test_a_short_page_is_one_window_without_a_hint(pages_server, access_config):
    text, metrics = await read(access_config(), {"url": WIKI + "Danube", "page": 1})
    assert text == "[page 1 of 1] Danube\nThe Danube flows through Vienna."
    assert metrics["access/windows"] == 1


async def test_a_page_joined_from_corpus_rows_by_url_is_served_too(pages_server, access_config):
    text, _ = await read(access_config(), {"url": WIKI + "Paris"})
    assert text == "[page 1 of 1] Paris\nParis is the capital and largest city of France.\n\nParis hosts the Louvre."


async def test_a_url_nobody_serves_is_not_found(pages_server, access_config):
    text, metrics = await read(access_config(), {"url": WIKI + "Atlantis"})
    assert text.startswith("[access failed: not_found] No page is stored under this url.")
    assert metrics["ok"] is False and metrics["access/failed/not_found"] == 1
    await read(access_config(), {"url": WIKI + "Atlantis"})
    assert pages_server.pages.reads == 2  # a missing page is not cached: it is asked again
    assert access_stats()["failures"] == {"not_found": 2}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing 'url' (got keys: none)"),
        ({"query": "Paul Walker"}, "missing 'url' (got keys: query)"),
        ({"url": ""}, "'url' is empty"),
        ({"url": "   "}, "'url' is empty"),
        ({"url": 7}, "'url' must be a string, got a number"),
        ({"url": ["a", "b"]}, "'url' must be a string, got a list"),
        ({"url": WALKER + " " + WIKI + "Danube"}, "one url without spaces"),
        ({"url": "https://x.org/" + "a" * 500}, "more than 400"),
        ({"url": WALKER, "page": "2"}, "'page' must be a whole number, got a string"),
        ({"url": WALKER, "page": 1.5}, "'page' must be a whole number, got a number"),
        ({"url": WALKER, "page": True}, "'page' must be a whole number, got a boolean"),
        ({"url": WALKER, "page": 0}, "'page' must be 1 or more, got 0"),
        (["not", "an", "object"], "arguments must be an object, got a list"),
    ],
)
async def test_bad_arguments_are_labelled_and_send_nothing(pages_server, access_config, arguments, message):
    text, metrics = await read(access_config(), arguments)
    assert text.startswith("[access error: invalid arguments] ") and message in text
    assert 'call access with {"url": "https://...", "page": 1}' in text
    assert metrics["failure"] == "invalid_arguments" and metrics["access/failed/invalid_arguments"] == 1
    assert pages_server.pages.reads == 0


async def test_a_page_read_again_comes_from_the_cache(pages_server, access_config):
    first, m1 = await read(access_config(), {"url": WALKER, "page": 2})
    again, m2 = await read(access_config(), {"url": " " + WALKER + "\n"})  # the same url, stripped
    twice, m3 = await read(access_config(), {"url": WALKER, "page": 2})
    assert pages_server.pages.reads == 1
    assert (m1["access/cache_hits"], m2["access/cache_hits"], m3["access/cache_hits"]) == (0, 1, 1)
    assert twice == first and again.startswith("[page 1 of")
    assert access_stats()["requests"] == 1 and access_stats()["cache_hits"] == 2


async def test_cache_off_asks_the_service_each_time(pages_server, access_config):
    for _ in range(3):
        await read(access_config(cache_size=0), {"url": WALKER})
    assert pages_server.pages.reads == 3


async def test_the_page_cache_keeps_to_its_byte_bound(pages_server, access_config):
    config = access_config(cache_max_bytes=1500)  # room for the short page, not the long one
    await read(config, {"url": WALKER})
    await read(config, {"url": WIKI + "Danube"})
    await read(config, {"url": WALKER})
    await read(config, {"url": WIKI + "Danube"})
    assert pages_server.pages.reads == 3
    assert 0 < AccessClient.shared(AccessToolConfig.from_dict(config)).cache.bytes <= 1500


async def test_identical_calls_in_flight_are_joined(pages_server, access_config):
    pages_server.pages.gate.clear()  # the service holds its page reads until the calls have queued
    tool = AccessTool(access_config())
    calls = [asyncio.ensure_future(tool.execute(f"t{i}", {"url": WALKER, "page": 1 + i % 2})) for i in range(5)]
    while not pages_server.pages.waiting:
        await asyncio.sleep(0.01)
    pages_server.pages.gate.set()
    results = await asyncio.gather(*calls)
    assert pages_server.pages.reads == 1
    assert all(metrics["ok"] for _, _, metrics in results)
    assert len({r.text for r, _, _ in results}) == 2  # windows 1 and 2 of the one page read
    assert sorted(metrics["access/joined"] for _, _, metrics in results) == [0, 1, 1, 1, 1]
    assert access_stats()["coalesced"] == 4


async def test_a_slow_service_is_cut_off_at_the_deadline_and_labelled(pages_server, access_config):
    pages_server.pages.gate.clear()
    text, metrics = await read(access_config(timeout=0.6, attempt_timeout=0.25, max_attempts=5), {"url": WALKER})
    assert text.startswith("[access failed: timeout] The page service did not answer within 0.6 s.")
    assert "not an empty result" in text
    assert metrics["ok"] is False and metrics["access/failed/timeout"] == 1
    assert pages_server.pages.reads >= 2  # per-attempt timeouts are retried within the deadline


async def test_a_dead_endpoint_is_labelled_unavailable(access_config):
    dead = f"http://127.0.0.1:{free_port()}"
    text, metrics = await read(access_config(retrieval_service_url=dead, max_attempts=2), {"url": WALKER})
    assert text.startswith("[access failed: unavailable] The page service could not be reached.")
    assert metrics["failure"] == "unavailable" and metrics["access/failed/unavailable"] == 1


async def test_a_server_error_is_labelled_and_not_retried(pages_server, access_config):
    pages_server.pages.error = RuntimeError("disk gone")
    text, metrics = await read(access_config(), {"url": WALKER})
    assert text.startswith("[access failed: server_error] The page service had an internal error.")
    assert metrics["failure"] == "server_error" and pages_server.pages.reads == 1


async def test_calls_fail_over_from_a_dead_endpoint(pages_server, access_config):
    dead = f"http://127.0.0.1:{free_port()}/retrieve"
    # both /access urls derived from the search urls; no cache, so each call is a request
    config = access_config(retrieval_service_url=[dead, f"{pages_server.url}/retrieve"], cache_size=0, eject_seconds=30)
    assert AccessToolConfig.from_dict(config).access_urls[0] == dead.replace("/retrieve", "/access")
    tool = AccessTool(config)
    results = [await tool.execute("t", {"url": WALKER, "page": 1}) for _ in range(10)]
    assert all(metrics["ok"] for _, _, metrics in results)
    assert len({r.text for r, _, _ in results}) == 1 and results[0][0].text.startswith("[page 1 of")
    assert pages_server.pages.reads == 10
    dead_endpoint = AccessClient.shared(tool.access_config).endpoints.endpoints[0]
    assert dead_endpoint.ejections == 1  # it was tried, failed and was skipped from then on


async def test_each_call_returns_its_metrics(pages_server, access_config):
    _, ok = await read(access_config(), {"url": WALKER, "page": 2})
    assert ok == {
        **ok,
        "ok": True,
        "failure": None,
        "access/calls": 1,
        "access/windows_read": 1,
        "access/cache_hits": 0,
        "access/joined": 0,
        "access/page": 2,
    }
    assert ok["access/latency_s"] > 0 and not any(key.startswith("access/failed/") for key in ok)
    _, failed = await read(access_config(), {"url": WIKI + "Atlantis"})
    assert failed["access/calls"] == 1 and failed["access/windows_read"] == 0 and failed["access/failed/not_found"] == 1
    stats = access_stats()
    assert (stats["calls"], stats["failed_calls"], stats["queries"]) == (2, 1, 2)


@pytest.mark.parametrize("reply", [{"result": "oops"}, {"result": [{"title": "no contents"}]}, {"pages": []}])
async def test_a_reply_that_is_not_the_access_shape_is_labelled_bad_response(access_config, reply):
    from fastapi import FastAPI

    from cpu_bench.background_server import BackgroundServer

    app = FastAPI()
    app.post("/access")(lambda: reply)
    with BackgroundServer(app) as server:
        text, metrics = await read(access_config(access_url=server.url), {"url": WALKER})
    assert text.startswith("[access failed: bad_response] The page service sent an unreadable reply.")
    assert metrics["access/failed/bad_response"] == 1


class AgentData:
    """What verl's ToolAgentLoop passes as ``agent_data``: the trajectory's ``extra_fields`` travel with it."""

    def __init__(self) -> None:
        self.extra_fields: dict = {}


async def test_each_call_lands_in_the_trajectory_fields(pages_server, access_config):
    tool = AccessTool(access_config())
    data = AgentData()
    instance_id, _ = await tool.create()
    calls = [{"url": WALKER}, {"url": WALKER, "page": 2}, {"url": WALKER}, {"url": WIKI + "Nobody"}, {"page": 1}]
    for arguments in calls:
        await tool.execute(instance_id, arguments, agent_data=data)
    fields = data.extra_fields
    assert fields["access_calls"] == 5
    assert fields["access_windows_read"] == 3
    assert fields["access_pages_opened"] == 1  # two windows of one page
    assert fields["access_repeats"] == 1  # window 1 again
    assert fields["access_failures"] == 2
    assert fields["access_failed_not_found"] == 1 and fields["access_failed_invalid_arguments"] == 1
    assert fields["access_latency_s"] > 0
