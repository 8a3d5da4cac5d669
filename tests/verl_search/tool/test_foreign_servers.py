"""Drop-in for the Search-R1 family: the tool against stand-ins of Search-R1's reference server and SkyRL's
single-query server, each under real uvicorn on 127.0.0.1, and the text the model reads from documents with titles."""

from __future__ import annotations

import pytest

from cpu_bench.background_server import BackgroundServer
from cpu_bench.testing.foreign_retrievers import search_r1_reference_app, skyrl_app
from verl_search import SearchTool, run_search
from verl_search.tool.client import RetrievalClient


@pytest.fixture
async def close_clients():
    yield
    await RetrievalClient.close_all()


@pytest.fixture
def corpus(stub_corpus):
    return stub_corpus


def config(url: str, **overrides) -> dict:
    return {"retrieval_service_url": url, "timeout": 5.0, "backoff_base": 0.01, "backoff_max": 0.05, **overrides}


@pytest.mark.parametrize("num_queries", [1, 2, 3])
async def test_search_r1_reference_server_answers_every_call(close_clients, corpus, num_queries):
    app = search_r1_reference_app(corpus)
    queries = ["Paris France", "Danube Vienna", "Marie Curie Warsaw"][:num_queries]
    with BackgroundServer(app) as server:
        response, _, metrics = await SearchTool(config(server.url)).execute("t", {"query_list": queries})
    assert metrics["ok"] is True, response.text
    assert "Paris is the capital" in response.text
    assert app.state.recorder.bodies == [{"queries": queries, "topk": 3, "return_scores": True}]


async def test_the_native_loop_search_gets_results_from_the_reference_server(close_clients, corpus):
    from verl_search import SearchToolConfig

    with BackgroundServer(search_r1_reference_app(corpus)) as server:
        outcome = await run_search(SearchToolConfig.from_dict(config(server.url)), ["Paris"])
    assert outcome.ok and outcome.text.startswith('Doc 1(Title: "Paris") Paris is the capital')


async def test_skyrl_single_query_server_is_detected_and_used(close_clients, corpus):
    app = skyrl_app(corpus)
    with BackgroundServer(app) as server:
        tool = SearchTool(config(server.url))
        response, _, metrics = await tool.execute("t", {"query_list": ["Paris France", "Danube Vienna"]})
        endpoint = RetrievalClient.shared(tool.search_config).endpoints.endpoints[0]
        again, _, _ = await tool.execute("t", {"query_list": ["Marie Curie"]})
    assert metrics["ok"] is True, response.text
    assert 'Results for query 1 "Paris France":\nDoc 1(Title: "Paris")' in response.text
    assert 'Results for query 2 "Danube Vienna":\nDoc 1(Title: "Danube")' in response.text
    assert again.text.startswith('Doc 1(Title: "Marie Curie")')
    assert endpoint.wire == "skyrl"
    assert sorted(b["query"] for b in app.state.recorder.bodies) == ["Danube Vienna", "Marie Curie", "Paris France"]
    assert all(b["return_scores"] is True and b["topk"] == 3 for b in app.state.recorder.bodies)


async def test_skyrl_form_can_be_configured_and_the_batch_form_forced(close_clients, corpus):
    with BackgroundServer(skyrl_app(corpus)) as server:
        forced, _, ok_metrics = await SearchTool(config(server.url, request_format="skyrl")).execute(
            "t", {"query_list": ["Paris"]}
        )
        batch, _, metrics = await SearchTool(config(server.url, request_format="search_r1")).execute(
            "t", {"query_list": ["Danube"]}
        )
    assert ok_metrics["ok"] and forced.text.startswith('Doc 1(Title: "Paris")')
    assert metrics["failure"] == "rejected" and batch.text.startswith("[search failed: rejected]")


async def test_our_own_rejections_do_not_switch_a_batch_server_to_the_single_form(stub, make_config):
    stub.state.set_fault("400")
    tool = SearchTool(make_config().model_dump())
    response, _, metrics = await tool.execute("t", {"query_list": ["Paris"]})
    assert metrics["failure"] == "rejected"
    assert RetrievalClient.shared(tool.search_config).endpoints.endpoints[0].wire is None
    stub.state.set_fault("ok")
    response, _, metrics = await tool.execute("t", {"query_list": ["Paris"]})
    assert metrics["ok"] and RetrievalClient.shared(tool.search_config).endpoints.endpoints[0].wire == "search_r1"


@pytest.mark.parametrize("app_factory", [search_r1_reference_app, skyrl_app])
async def test_documents_with_a_title_field_show_the_title_once(close_clients, corpus, app_factory):
    with BackgroundServer(app_factory(corpus, fields="titled")) as server:
        response, _, metrics = await SearchTool(config(server.url)).execute("t", {"query_list": ["Paris France"]})
    assert metrics["ok"] is True, response.text
    first = response.text.splitlines()[0]
    assert first == "Doc 1(Title: Paris) Paris is the capital and largest city of France."
