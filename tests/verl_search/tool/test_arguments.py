"""Malformed model arguments: each gets a short instructive text, no exception and no HTTP request."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_search import SearchTool, search_stats
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.search_tool import run_search

MEGABYTE = "x" * 1_000_000


def _nested(depth: int, wrap) -> object:
    value: object = "x"
    for _ in range(depth):
        value = wrap(value)
    return value


#: deeper than Python's recursion limit: json.dumps and repr of it raise RecursionError
DEEP_LIST = _nested(5000, lambda v: [v])
DEEP_OBJECT = _nested(5000, lambda v: {"a": v})

INVALID = [
    pytest.param(None, "null", id="null"),
    pytest.param(42, "a number", id="number"),
    pytest.param(True, "a boolean", id="boolean"),
    pytest.param({}, "missing 'query_list'", id="empty-object"),
    pytest.param({"queries": ["a"]}, "missing 'query_list' (got keys: queries)", id="wrong-key"),
    pytest.param({"query_list": []}, "'query_list' is empty", id="empty-list"),
    pytest.param({"query_list": None}, "got null", id="null-list"),
    pytest.param({"query_list": 7}, "got a number", id="number-list"),
    pytest.param({"query_list": {"q": "a"}}, "got an object", id="object-list"),
    pytest.param({"query_list": [""]}, "query 1 is empty", id="empty-string"),
    pytest.param({"query_list": ["   \n\t"]}, "query 1 is empty", id="whitespace-string"),
    pytest.param({"query_list": ["ok", 3]}, "query 2 is a number, not a string", id="non-string"),
    pytest.param({"query_list": ["ok", None]}, "query 2 is null, not a string", id="null-item"),
    pytest.param({"query_list": [["nested"]]}, "query 1 is nested", id="nested-list"),
    pytest.param({"query_list": [{"query": "x"}]}, "query 1 is nested", id="nested-object"),
    pytest.param({"query_list": [DEEP_LIST]}, "query 1 is nested (a list nested too deeply", id="deep-list"),
    pytest.param({"query_list": [DEEP_OBJECT]}, "query 1 is nested (an object nested too deeply", id="deep-object"),
    pytest.param(DEEP_LIST, "query 1 is nested (a list nested too deeply", id="bare-deep-list"),
    pytest.param({"query": ""}, "query 1 is empty", id="empty-query-key"),
    pytest.param({"query": 5}, "got a number", id="number-query-key"),
    pytest.param([], "'query_list' is empty", id="bare-empty-list"),
    pytest.param("", "query 1 is empty", id="bare-empty-string"),
]


@pytest.mark.parametrize(("arguments", "expected"), INVALID)
async def test_invalid_arguments_get_instructive_text_and_send_nothing(stub, make_config, arguments, expected):
    tool = SearchTool(make_config().model_dump())
    instance_id, _ = await tool.create()
    response, reward, metrics = await tool.execute(instance_id, arguments)

    assert response.text.startswith("[search error: invalid arguments]")
    assert expected in response.text
    assert '{"query_list": ["first query", "second query"]}' in response.text  # names the expected form
    assert len(response.text) < 300
    assert metrics["ok"] is False and metrics["failure"] == "invalid_arguments"
    assert reward == 0.0
    assert stub.state.requests == 0
    assert search_stats()["invalid_arguments"] == 1
    await tool.release(instance_id)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param("Paris", id="bare-string"),
        pytest.param({"query": "Paris"}, id="query-key"),
        pytest.param({"query_list": "Paris"}, id="string-query-list"),
        pytest.param(["Paris"], id="bare-list"),
        pytest.param({"query_list": ["Paris"], "extra": 1}, id="extra-key-ignored"),
    ],
)
async def test_lenient_forms_are_searched_as_one_query(stub, make_config, arguments):
    tool = SearchTool(make_config().model_dump())
    response, _, metrics = await tool.execute("t", arguments)
    assert metrics["ok"] is True
    assert response.text.startswith('Doc 1(Title: "Paris")')
    assert stub.state.queries == ["Paris"]


async def test_too_many_queries_are_capped_and_reported(stub, make_config):
    tool = SearchTool(make_config(max_queries=2).model_dump())
    response, _, metrics = await tool.execute("t", {"query_list": ["Paris", "Danube", "Curie", "Walker"]})
    assert metrics["ok"] is True
    assert "only the first 2 of 4 queries were searched" in response.text
    assert stub.state.queries == ["Paris", "Danube"]


async def test_megabyte_query_is_cut_and_reported(stub, make_config):
    tool = SearchTool(make_config(max_query_chars=100).model_dump())
    response, _, metrics = await tool.execute("t", {"query_list": [MEGABYTE]})
    assert metrics["ok"] is True
    assert "query 1 was cut to 100 characters" in response.text
    assert [len(q) for q in stub.state.queries] == [100]


async def test_thousands_of_queries_send_one_bounded_request(stub, make_config):
    tool = SearchTool(make_config().model_dump())
    response, _, metrics = await tool.execute("t", {"query_list": [f"q{i}" for i in range(5000)]})
    assert metrics["ok"] is True and metrics["num_queries"] == 8
    assert stub.state.requests == 1
    assert len(response.text) <= 6000


@pytest.mark.parametrize("arguments", [{"query_list": ["\ud800"]}, {"query_list": ["ok", " \udfff \ud800 "]}])
async def test_a_query_of_lone_surrogates_is_refused_before_any_request(stub, make_config, arguments):
    response, _, metrics = await SearchTool(make_config().model_dump()).execute("t", arguments)
    assert response.text.startswith("[search error: invalid arguments]")
    assert "lone UTF-16 surrogates" in response.text and "plain text" in response.text
    assert metrics["failure"] == "invalid_arguments"
    assert stub.state.requests == 0


async def test_lone_surrogates_are_removed_from_a_query_and_the_model_is_told(stub, make_config):
    # "\ud83d\ude00" arrives as two code points when a JSON parser left the pair split; it is joined, not dropped
    arguments = {"query_list": ["Paris\ud800 France", "Danube \ud83d\ude00"]}
    response, _, metrics = await SearchTool(make_config().model_dump()).execute("t", arguments)
    assert metrics["ok"] is True
    assert response.text.startswith("[note: query 1: 1 invalid character(s) (lone UTF-16 surrogates) removed]")
    assert stub.state.queries == ["Paris France", "Danube \U0001f600"]
    assert all(q.encode("utf-8") for q in stub.state.queries)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_ARGUMENTS = _JSON | st.fixed_dictionaries({"query_list": _JSON}) | st.fixed_dictionaries({"query": _JSON})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=_ARGUMENTS)
def test_no_argument_a_model_can_send_is_labelled_a_tool_bug(closed_url_config, arguments):
    """Fuzzing the call's arguments: each is searched (here: the engine is unreachable) or refused as the model's
    invalid arguments, never reported as the tool's internal failure."""
    outcome = asyncio.run(run_search(closed_url_config, arguments))
    assert outcome.failure in ("invalid_arguments", "unavailable"), outcome.text
    if outcome.failure == "invalid_arguments":
        assert outcome.text.startswith("[search error: invalid arguments]") and len(outcome.text) < 400


@pytest.fixture
def closed_url_config():
    from cpu_bench.background_server import free_port

    return SearchToolConfig.from_dict(
        {"retrieval_service_url": f"http://127.0.0.1:{free_port()}/retrieve", "timeout": 2, "max_attempts": 1}
    )
