"""POST /access on the web backend, end to end: pages fetched from a real page server on 127.0.0.1 (loopback opened by
--web_fetch_allow_loopback), kept in the web cache file and replayed bit for bit with no connection; refused
addresses and failing sites answer null, are counted by kind and are never cached; the pages file comes first."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import sqlite3
import threading

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cpu_bench.background_server import BackgroundServer


class PageSite:
    """A small web site: ``/page/<name>`` is an HTML page naming its visit, ``/fail/<name>`` a 500, ``/big`` a long
    page, ``/hang`` never answers, and ``/together/<name>`` answers once two of its pages are being asked at once."""

    def __init__(self) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        self.together = 0
        self.closing = threading.Event()
        routes = [Route("/page/{name}", self.page), Route("/fail/{name}", self.fail), Route("/big", self.big),
                  Route("/hang", self.hang), Route("/together/{name}", self.meet),
                  Route("/watch", self.watch)]  # fmt: skip
        self.hung_up = threading.Event()
        self.app = Starlette(routes=routes)
        self.url = ""

    def _count(self, request: Request) -> None:
        self.hits[request.url.path] += 1

    async def page(self, request: Request) -> Response:
        self._count(request)
        name, visit = request.path_params["name"], self.hits[request.url.path]
        body = f"<html><head><title>Page {name}</title></head><body><p>About {name}, visit {visit}.</p></body></html>"
        return Response(body, media_type="text/html")

    async def fail(self, request: Request) -> Response:
        self._count(request)
        return Response("<p>internal error</p>", status_code=500, media_type="text/html")

    async def big(self, request: Request) -> Response:
        self._count(request)
        return Response("word " * 2000, media_type="text/plain")

    async def hang(self, request: Request) -> Response:
        self._count(request)
        for _ in range(1000):
            if self.closing.is_set():
                break
            await asyncio.sleep(0.01)
        return Response("late", media_type="text/plain")

    async def watch(self, request: Request) -> Response:
        """Never answers; sets ``hung_up`` once the fetcher closes its connection."""
        self._count(request)
        while not self.closing.is_set():
            if await request.is_disconnected():
                self.hung_up.set()
                break
            await asyncio.sleep(0.01)
        return Response("late", media_type="text/plain")

    async def meet(self, request: Request) -> Response:
        self._count(request)
        self.together += 1
        for _ in range(1000):
            if self.together >= 2 or self.closing.is_set():
                break
            await asyncio.sleep(0.01)
        text = "met" if self.together >= 2 else "alone"  # alone: the pages were fetched one after another
        return Response(f"<p>{request.path_params['name']} {text}</p>", media_type="text/html")


@pytest.fixture(scope="module")
def page_site():
    site = PageSite()
    with BackgroundServer(site.app, timeout_graceful_shutdown=1) as server:
        site.url = server.url
        yield site
        site.closing.set()


@pytest.fixture
def site(page_site) -> PageSite:
    page_site.hits.clear()
    page_site.together = 0
    page_site.hung_up.clear()
    return page_site


def access(url: str, urls: list) -> httpx.Response:
    return httpx.post(f"{url}/access", json={"urls": urls}, timeout=30)


def web_metrics(url: str) -> dict:
    return httpx.get(f"{url}/metrics").json()["web"]


def test_a_fetched_page_comes_back_in_the_page_shape_and_then_from_the_cache(
    provider, web_server, site, only_loopback_connections, tmp_path
):
    url, _ = web_server(web_fetch_allow_loopback=True)
    page_url = f"{site.url}/page/curie"
    first = access(url, [page_url])
    assert first.status_code == 200
    page = first.json()["result"][0]
    assert page == {"url": page_url, "final_url": page_url, "title": "Page curie", "contents": "About curie, visit 1.",
                    "truncated": False}  # fmt: skip
    second = access(url, [page_url])
    assert second.content == first.content and site.hits["/page/curie"] == 1
    web = web_metrics(url)
    assert (web["page_lookups_total"], web["page_cache_hits_total"], web["page_fetches_total"]) == (2, 1, 1)
    assert web["cached_pages"] == 1 and web["page_fetch_failures_by_kind"] == {}
    assert web["run_live_calls"] == 0 and provider.requests == []  # pages are not charged to the search budget
    with sqlite3.connect(tmp_path / "web.sqlite3") as db:
        assert [(u, json.loads(p)) for u, p in db.execute("SELECT url, page FROM pages")] == [(page_url, page)]


def test_a_requests_urls_are_fetched_together(provider, web_server, site):
    url, _ = web_server(web_fetch_allow_loopback=True)
    answer = access(url, [f"{site.url}/together/a", f"{site.url}/together/b"]).json()["result"]
    assert [page["contents"] for page in answer] == ["a met", "b met"]


def test_a_replay_answers_the_recorded_page_bit_for_bit_and_null_for_the_rest_without_connecting(
    provider, web_server, site, only_loopback_connections, monkeypatch
):
    url, _ = web_server(web_fetch_allow_loopback=True)
    recorded = access(url, [f"{site.url}/page/recorded"])
    monkeypatch.delenv("SERPER_API_KEY")
    replay_url, _ = web_server(web_cache_mode="replay", web_fetch_allow_loopback=True)
    fetched = dict(site.hits)
    only_loopback_connections.clear()
    replayed = access(replay_url, [f"{site.url}/page/recorded"])
    missed = access(replay_url, [f"{site.url}/page/recorded", f"{site.url}/page/never-fetched"])
    assert replayed.status_code == 200 and replayed.content == recorded.content
    assert missed.json()["result"] == [recorded.json()["result"][0], None]
    assert dict(site.hits) == fetched and provider.requests == []
    assert {port for _, port in only_loopback_connections} <= {int(replay_url.rsplit(":", 1)[1])}  # its clients only
    web = web_metrics(replay_url)
    assert (web["page_cache_hits_total"], web["page_replay_misses_total"], web["page_fetches_total"]) == (2, 1, 0)


def test_live_mode_refetches_and_records_the_new_page(provider, web_server, site, monkeypatch):
    url, _ = web_server(web_fetch_allow_loopback=True)
    assert access(url, [f"{site.url}/page/news"]).json()["result"][0]["contents"] == "About news, visit 1."
    live_url, _ = web_server(web_cache_mode="live", web_fetch_allow_loopback=True)
    assert access(live_url, [f"{site.url}/page/news"]).json()["result"][0]["contents"] == "About news, visit 2."
    monkeypatch.delenv("SERPER_API_KEY")
    replay_url, _ = web_server(web_cache_mode="replay")
    assert access(replay_url, [f"{site.url}/page/news"]).json()["result"][0]["contents"] == "About news, visit 2."
    assert site.hits["/page/news"] == 2


def test_refused_addresses_answer_null_and_are_counted_without_a_connection_off_this_machine(
    provider, web_server, site, only_loopback_connections, caplog
):
    url, _ = web_server(web_fetch_allow_loopback=True)
    caplog.set_level(logging.INFO, logger="local_dense_retriever.web.access")
    urls = ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", f"{site.url}/page/public"]
    answer = access(url, urls)
    assert answer.status_code == 200
    result = answer.json()["result"]
    assert result[:2] == [None, None] and result[2]["title"] == "Page public"
    assert all(host == "127.0.0.1" for host, _ in only_loopback_connections)
    web = web_metrics(url)
    assert web["page_fetch_failures_by_kind"] == {"address_refused": 2} and web["page_fetch_failures_total"] == 2
    assert web["cached_pages"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "local_dense_retriever.web.access"]
    assert lines == ["page fetch failed: host 169.254.169.254, address_refused",
                     "page fetch failed: host 10.0.0.1, address_refused"]  # fmt: skip


def test_loopback_pages_are_refused_unless_the_test_flag_opens_them(provider, web_server, site):
    url, _ = web_server()
    assert access(url, [f"{site.url}/page/local"]).json() == {"result": [None]}
    assert site.hits["/page/local"] == 0
    assert web_metrics(url)["page_fetch_failures_by_kind"] == {"address_refused": 1}


def test_a_failing_page_server_answers_null_and_nothing_is_cached(provider, web_server, site, tmp_path, caplog):
    url, _ = web_server(web_fetch_allow_loopback=True)
    caplog.set_level(logging.INFO, logger="local_dense_retriever.web.access")
    assert access(url, [f"{site.url}/fail/x"]).json() == {"result": [None]}
    assert access(url, [f"{site.url}/fail/x"]).json() == {"result": [None]}
    assert site.hits["/fail/x"] == 2  # a failure is never recorded: the next request asks again
    web = web_metrics(url)
    assert web["page_fetch_failures_by_kind"] == {"upstream_status": 2} and web["cached_pages"] == 0
    with sqlite3.connect(tmp_path / "web.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM pages").fetchone() == (0,)
    assert "internal error" not in caplog.text and "/fail/x" not in caplog.text  # host and kind only


def test_the_fetch_flags_bound_each_page(provider, web_server, site):
    url, _ = web_server(web_fetch_allow_loopback=True, web_fetch_max_bytes=1024, web_fetch_timeout_s=0.5)
    big, hung = access(url, [f"{site.url}/big", f"{site.url}/hang"]).json()["result"]
    assert big["truncated"] is True and len(big["contents"]) <= 1024
    assert hung is None
    assert web_metrics(url)["page_fetch_failures_by_kind"] == {"fetch_timeout": 1}


def test_the_pages_file_comes_before_the_web(provider, web_server, site, tmp_path):
    in_file = f"{site.url}/page/filed"
    pages = tmp_path / "pages.jsonl"
    pages.write_text(json.dumps({"url": in_file, "title": "From the file", "contents": "Filed text."}) + "\n")
    url, _ = web_server(web_fetch_allow_loopback=True, pages_path=pages)
    result = access(url, [in_file, f"{site.url}/page/fresh"]).json()["result"]
    assert result[0] == {"url": in_file, "title": "From the file", "contents": "Filed text."}
    assert result[1]["title"] == "Page fresh"
    assert site.hits["/page/filed"] == 0 and web_metrics(url)["page_lookups_total"] == 1


def test_bad_urls_answer_null_and_too_many_urls_are_refused(provider, web_server, site):
    url, _ = web_server(web_fetch_allow_loopback=True, max_queries_per_request=3)
    page_url = f"{site.url}/page/ok"
    bad = ["file:///etc/passwd", "http://x.test/\ud800"]  # JSON carries the lone surrogate as an escape
    too_many = httpx.post(f"{url}/access", content=json.dumps({"urls": [*bad, "not a url", page_url]}))
    assert too_many.status_code == 422 and too_many.json() == {
        "error": "invalid_request", "detail": "4 urls; the limit is 3"
    }  # fmt: skip
    assert site.hits["/page/ok"] == 0
    answer = httpx.post(f"{url}/access", content=json.dumps({"urls": [*bad, page_url]}))
    assert answer.status_code == 200
    assert [page and page["title"] for page in answer.json()["result"]] == [None, None, "Page ok"]
    assert web_metrics(url)["page_fetch_failures_by_kind"] == {"bad_url": 2}
    assert httpx.post(f"{url}/access", json={"urls": "x"}).status_code == 422


def test_a_web_server_refuses_more_urls_than_it_may_fetch_in_one_request(provider, web_server, site):
    url, _ = web_server(web_fetch_allow_loopback=True, web_fetch_max_urls=2)
    urls = [f"{site.url}/page/{name}" for name in ("a", "b", "c")]
    refused = access(url, urls)
    assert refused.status_code == 422 and refused.json() == {
        "error": "invalid_request",
        "detail": "3 urls; the limit is 2",
    }
    assert sum(site.hits.values()) == 0 and web_metrics(url)["page_lookups_total"] == 0  # nothing looked up or fetched
    assert [page["title"] for page in access(url, urls[:2]).json()["result"]] == ["Page a", "Page b"]


def test_a_client_that_hangs_up_stops_its_page_fetches(provider, web_server, site):
    url, _ = web_server(web_fetch_allow_loopback=True, web_fetch_timeout_s=120)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before the fetch's own deadline
        httpx.post(f"{url}/access", json={"urls": [f"{site.url}/watch"]}, timeout=1)
    assert site.hung_up.wait(60), "the page fetch went on after its client hung up"
    assert site.hits["/watch"] == 1
    assert httpx.get(f"{url}/health").status_code == 200
