"""AccessToolConfig and the two-tool YAML: where /access is, keys checked at start-up by name, and verl itself building
both tools from tool_config/search_access_tool_config.yaml and running them against the real service."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl_search import AccessTool, AccessToolConfig, SearchTool, SearchToolConfig
from verl_search.errors import ConfigError

TOOL_CONFIG = Path(__file__).resolve().parents[3] / "tool_config"
BOTH_YAML = TOOL_CONFIG / "search_access_tool_config.yaml"
SEARCH_YAML = TOOL_CONFIG / "search_tool_config.yaml"


@pytest.mark.parametrize(
    ("raw", "urls"),
    [
        ({}, ("http://127.0.0.1:8000/access",)),
        ({"retrieval_service_url": "http://h:1"}, ("http://h:1/access",)),
        ({"retrieval_service_url": "http://h:1/retrieve"}, ("http://h:1/access",)),
        (
            {"retrieval_service_url": ["http://a:1", "http://b:2/api/retrieve"]},
            ("http://a:1/access", "http://b:2/api/access"),
        ),
        ({"retrieval_service_url": "http://h:1/custom", "access_url": "http://p:9"}, ("http://p:9/access",)),
        ({"access_url": ["http://p:9/pages", "http://q:9/"]}, ("http://p:9/pages", "http://q:9/access")),
    ],
)
def test_the_access_urls_derive_from_the_search_urls_or_are_given(raw, urls):
    assert AccessToolConfig.from_dict(raw).access_urls == urls


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"retrieval_service_url": "http://h:1/custom"}, "set access_url"),
        ({"access_url": "localhost:8000"}, "access_url 'localhost:8000' is not an http(s) URL"),
        ({"access_url": []}, "access_url must be a URL or a non-empty list"),
        ({"topk": 3}, "unknown key 'topk'"),
        ({"max_result_chars": 200}, "'max_result_chars': Input should be greater than or equal to 1000"),
    ],
)
def test_a_bad_access_config_fails_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match="invalid access tool config") as info:
        AccessTool(raw)
    assert message in str(info.value)


def test_building_the_access_tool_prints_nothing(capsys):
    tool = AccessTool({"retrieval_service_url": "http://127.0.0.1:9/retrieve"})
    assert tool.name == "access" and tool.get_openai_tool_schema().function.parameters.required == ["url"]
    assert capsys.readouterr().out == ""


def test_the_yaml_documents_every_key_at_its_default_and_search_as_its_own_yaml_does():
    both = yaml.safe_load(BOTH_YAML.read_text())["tools"]
    assert [t["class_name"] for t in both] == ["verl_search.SearchTool", "verl_search.AccessTool"]
    search_alone = yaml.safe_load(SEARCH_YAML.read_text())["tools"][0]
    assert both[0]["config"].pop("show_urls") is True  # the one difference: the model sees the urls it can open
    assert search_alone["config"].pop("show_urls") is False
    assert both[0] == search_alone
    assert AccessToolConfig.from_dict(both[1]["config"]) == AccessToolConfig.from_dict({})
    assert set(both[1]["config"]) == AccessToolConfig.known_keys() - {"default_timeout", "enable_global_rate_limit"}


def _yaml_for(tmp_path: Path, url: str, **access_extra) -> Path:
    raw = yaml.safe_load(BOTH_YAML.read_text())
    for tool in raw["tools"]:
        tool["config"]["retrieval_service_url"] = f"{url}/retrieve"
    raw["tools"][1]["config"].update(access_extra)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_an_unknown_access_key_fails_verl_start_up_by_name(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    path = _yaml_for(tmp_path, "http://127.0.0.1:9", max_window_chars=3000)
    with pytest.raises(ConfigError, match="unknown key 'max_window_chars'"):
        initialize_tools_from_config(str(path))


async def test_verl_builds_both_tools_from_the_yaml_and_they_answer(pages_server, tmp_path, served):
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = {tool.name: tool for tool in initialize_tools_from_config(str(_yaml_for(tmp_path, pages_server.url)))}
    assert set(tools) == {"search", "access"}
    assert isinstance(tools["search"], SearchTool) and isinstance(tools["access"], AccessTool)
    shown = SearchToolConfig.from_dict({"retrieval_service_url": pages_server.url, "show_urls": True})
    assert tools["search"].search_config == shown
    schema = tools["access"].get_openai_tool_schema().model_dump()["function"]["parameters"]
    assert set(schema["properties"]) == {"url", "page"} and schema["required"] == ["url"]
    assert schema["properties"]["page"]["type"] == "integer"

    search, _, search_metrics = await tools["search"].execute("t", {"query_list": ["Paris capital"]})
    assert search_metrics["ok"] and search.text.startswith('Doc 1(Title: "Paris")(URL: http')
    assert ") Paris is the capital" in search.text.splitlines()[0]
    page, _, access_metrics = await tools["access"].execute("t", {"url": served.wiki + "Paul_Walker"})
    # the YAML's 6000-character window holds the whole 3,000-character page
    assert access_metrics["ok"] and page.text == "[page 1 of 1] Paul Walker\n" + served.pages[0]["contents"]
    assert pages_server.pages.reads == 1
