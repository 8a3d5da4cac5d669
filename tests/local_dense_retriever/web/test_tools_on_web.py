"""The model's tools on the web backend, end to end: a url that SearchTool shows (``show_urls``) for a web hit is
opened by AccessTool through a real server's POST /access, the page fetched from a page server on 127.0.0.1 on a
record run and kept in the cache; a replay server on that cache answers the same search and page with no provider
call and no fetch, and a page it never recorded, or one the fetcher refuses, is a labelled failure for the model."""

from __future__ import annotations

import collections
import re

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cpu_bench.background_server import BackgroundServer
from verl_search import AccessTool, SearchTool
from verl_search.tool.transport import SharedClient

SHOWN_URL = re.compile(r"\(URL: ([^)]+)\)")


class Site:
    """``/page/<name>``: an HTML page about ``name``; every request is counted by path."""

    def __init__(self) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        self.app = Starlette(routes=[Route("/page/{name}", self.page)])
        self.url = ""

    async def page(self, request: Request) -> Response:
        self.hits[request.url.path] += 1
        name = request.path_params["name"]
        body = f"<html><head><title>Page {name}</title></head><body><p>All about {name}.</p></body></html>"
        return Response(body, media_type="text/html")


@pytest.fixture(scope="module")
def page_site():
    site = Site()
    with BackgroundServer(site.app, timeout_graceful_shutdown=1) as server:
        site.url = server.url
        yield site


@pytest.fixture
def site(page_site, provider, monkeypatch) -> Site:
    """The page site, its hit counts cleared; the provider stub's hits link to its pages (Serper's shape)."""
    page_site.hits.clear()

    def answer(query: str, k: int) -> dict:
        slug = query.replace(" ", "-")
        organic = [{"title": f"{query} {i}", "link": f"{page_site.url}/page/{slug}-{i}", "snippet": f"On {query}.",
                    "position": i + 1} for i in range(k)]  # fmt: skip
        return {"searchParameters": {"q": query, "num": k}, "organic": organic, "credits": 1}

    monkeypatch.setattr(provider, "answer", answer)
    return page_site


@pytest.fixture
async def tools():
    """Factory: server url -> (SearchTool with show_urls, AccessTool); closes the loop's clients after."""

    def make(url: str) -> tuple[SearchTool, AccessTool]:
        common = {"retrieval_service_url": url, "timeout": 5.0, "backoff_base": 0.01, "backoff_max": 0.05}
        return SearchTool({**common, "topk": 2, "show_urls": True}), AccessTool({**common, "max_result_chars": 1000})

    yield make
    await SharedClient.close_all()


async def search_and_open(search: SearchTool, access: AccessTool, query: str) -> tuple[str, str, str]:
    """What a model does: search, take the first hit's url as shown, open it; (search text, url, page text)."""
    found, _, metrics = await search.execute("t", {"query_list": [query]})
    assert metrics["ok"], found.text
    url = SHOWN_URL.search(found.text).group(1)
    page, _, _ = await access.execute("t", {"url": url})
    return found.text, url, page.text


async def test_a_shown_url_is_opened_from_a_fetch_then_replayed_from_the_cache(
    provider, web_server, site, tools, monkeypatch, only_loopback_connections
):
    url, _ = web_server(web_fetch_allow_loopback=True)
    search, access = tools(url)
    found, page_url, page = await search_and_open(search, access, "marie curie")
    assert found.startswith("Doc 1(Title: ") and page_url == f"{site.url}/page/marie-curie-0"
    assert "All about marie-curie-0." in page and not page.startswith("[access")
    assert site.hits == {"/page/marie-curie-0": 1} and len(provider.requests) == 1

    monkeypatch.delenv("SERPER_API_KEY")  # a replay needs no key: nothing may reach the provider
    replay_url, _ = web_server(web_cache_mode="replay", web_fetch_allow_loopback=True)
    search, access = tools(replay_url)
    replayed = await search_and_open(search, access, "marie curie")
    assert replayed == (found, page_url, page)
    assert len(provider.requests) == 1 and site.hits == {"/page/marie-curie-0": 1}  # no provider call, no fetch

    missed, _, metrics = await access.execute("t", {"url": f"{site.url}/page/never-fetched"})
    assert missed.text.startswith("[access failed: not_found] ") and metrics["failure"] == "not_found"
    assert site.hits["/page/never-fetched"] == 0


async def test_a_page_the_fetcher_refuses_is_a_labelled_failure_for_the_model(provider, web_server, site, tools):
    url, _ = web_server()  # no loopback: the site on 127.0.0.1 is refused, as a private address is
    search, access = tools(url)
    _, page_url, page = await search_and_open(search, access, "ada lovelace")
    assert page_url.startswith(site.url) and page.startswith("[access failed: not_found] ")
    for private in ("http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/"):
        refused, _, metrics = await access.execute("t", {"url": private})
        assert refused.text.startswith("[access failed: not_found] ") and not metrics["ok"]
    assert sum(site.hits.values()) == 0
