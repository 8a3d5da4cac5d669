"""SearchTool builds like verl's BaseTool (the same attributes) but prints nothing: verl 0.9.1's BaseTool.__init__
dumps the tool schema as indented JSON on stdout, once per process that builds the tool."""

from __future__ import annotations

from verl.tools.base_tool import BaseTool

from verl_search import SearchTool
from verl_search.tool.search_tool import default_tool_schema


def test_basetool_init_still_sets_only_what_searchtool_sets(capsys):
    """Fails when verl's BaseTool.__init__ starts setting another attribute (SearchTool would then lack it) or stops
    printing (the bypass could then go)."""
    base = BaseTool.__new__(BaseTool)
    BaseTool.__init__(base, {"k": 1}, default_tool_schema())
    assert '"name": "search"' in capsys.readouterr().out
    ours = SearchTool({"retrieval_service_url": "http://127.0.0.1:9/retrieve"})
    assert set(vars(base)) == {"config", "tool_schema", "name"}
    assert set(vars(base)) <= set(vars(ours))
    assert ours.name == "search" and ours.tool_schema == ours.get_openai_tool_schema() == base.tool_schema


def test_building_the_tool_prints_nothing(capsys):
    SearchTool({"retrieval_service_url": "http://127.0.0.1:9/retrieve"})
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
