"""SearchToolConfig: defaults, aliases, URL handling, and errors that name the bad key; built through verl's loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl_search import SearchTool, SearchToolConfig
from verl_search.errors import ConfigError
from verl_search.tool.client import RetrievalClient

TOOL_YAML = str(Path(__file__).resolve().parents[3] / "tool_config" / "search_tool_config.yaml")


def test_defaults_match_the_documented_ones():
    c = SearchToolConfig.from_dict({"type": "native"})
    assert (c.topk, c.num_workers, c.rate_limit, c.timeout) == (3, 120, 120.0, 30.0)
    assert c.retrieval_service_url == ("http://127.0.0.1:8000/retrieve",)


def test_default_timeout_alias_of_older_configs():
    assert SearchToolConfig.from_dict({"default_timeout": 7}).timeout == 7


@pytest.mark.parametrize("value", [None, 0])
async def test_rate_limit_null_or_zero_means_unlimited(value):
    assert RetrievalClient(SearchToolConfig.from_dict({"rate_limit": value})).limiter is None


def test_urls_one_or_many_with_retrieve_appended_to_bare_hosts():
    c = SearchToolConfig.from_dict({"retrieval_service_url": ["http://a:1", "http://b:2/", "http://c:3/custom"]})
    assert c.retrieval_service_url == ("http://a:1/retrieve", "http://b:2/retrieve", "http://c:3/custom")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"topK": 3}, "unknown key 'topK'"),
        ({"topk": 0}, "'topk': Input should be greater than or equal to 1"),
        ({"timeout": -1}, "'timeout'"),
        ({"retrieval_service_url": "localhost:8000"}, "not an http(s) URL"),
        ({"retrieval_service_url": []}, "non-empty list"),
        ({"type": "mcp"}, "'type'"),
    ],
)
def test_bad_config_names_the_key(raw, message):
    with pytest.raises(ConfigError, match="invalid search tool config") as info:
        SearchToolConfig.from_dict(raw)
    assert message in str(info.value)


def test_repo_yaml_builds_our_tool_through_verl(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(TOOL_YAML)
    assert len(tools) == 1 and isinstance(tools[0], SearchTool)
    assert tools[0].name == "search"
    schema = tools[0].get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["required"] == ["query_list"]
    # every key the YAML documents is one the tool knows, with its default value
    raw = yaml.safe_load(open(TOOL_YAML))["tools"][0]["config"]
    assert SearchToolConfig.from_dict(raw) == SearchToolConfig.from_dict({})


def test_unknown_key_in_yaml_fails_verl_start_up_by_name(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    raw = yaml.safe_load(open(TOOL_YAML))
    raw["tools"][0]["config"]["num_worker"] = 8
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="unknown key 'num_worker'"):
        initialize_tools_from_config(str(path))


#: every key verl ≤0.5's search tool read (verl/tools/search_tool.py) or its example YAML set
#: (examples/sglang_multiturn/config/tool_config/search_tool_config.yaml)
VERL_05_CONFIG = {
    "type": "native",
    "retrieval_service_url": "http://127.0.0.1:8000/retrieve",
    "num_workers": 120,
    "rate_limit": 120,
    "default_timeout": 30,
    "enable_global_rate_limit": True,
    "topk": 3,
}


def test_every_key_of_verl_05s_search_tool_config_is_accepted(caplog):
    from verl_search.tool import config as config_module

    config_module._warned.discard("enable_global_rate_limit")
    caplog.set_level("WARNING", logger="verl_search")
    for _ in range(3):
        c = SearchToolConfig.from_dict(VERL_05_CONFIG)
    assert (c.num_workers, c.rate_limit, c.timeout, c.topk) == (120, 120.0, 30.0, 3)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'enable_global_rate_limit' is deprecated" in warnings[0]
    assert "enable_global_rate_limit" in SearchToolConfig.known_keys()


def test_request_format_is_checked():
    assert SearchToolConfig.from_dict({"request_format": "skyrl"}).request_format == "skyrl"
    with pytest.raises(ConfigError, match="'request_format'"):
        SearchToolConfig.from_dict({"request_format": "flask"})
