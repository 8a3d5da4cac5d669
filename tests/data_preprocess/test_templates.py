"""prompt.yaml: the shipped templates match how each agent loop expects the model to search; bad files are refused."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from verl_search.data.errors import TemplateError
from verl_search.data.templates import load_templates


@pytest.fixture
def shipped(repo_root):
    return load_templates(repo_root / "data_preprocess" / "prompt.yaml")


def test_shipped_templates(shipped):
    assert shipped.default == "tool_call"
    assert shipped.templates["tool_call"].agent_name == "tool_agent"
    assert shipped.templates["search_r1"].agent_name == "search_r1_agent"
    assert shipped.templates["search_r1"].system is None


def _example_call(shipped) -> dict:
    user = shipped.templates["tool_call"].user
    block = re.search(r"<tool_call>(.*?)</tool_call>", user, re.DOTALL)
    assert block, "the tool_call template must show the exact call form"
    return json.loads(block.group(1))


def test_tool_call_example_matches_the_shipped_tool_schema(shipped, repo_root):
    tool_yaml = yaml.safe_load((repo_root / "tool_config" / "search_tool_config.yaml").read_text())
    function = tool_yaml["tools"][0]["tool_schema"]["function"]
    call = _example_call(shipped)
    assert call["name"] == function["name"] == "search"
    assert set(call["arguments"]) == set(function["parameters"]["required"]) == {"query_list"}
    assert all(isinstance(q, str) for q in call["arguments"]["query_list"])


async def test_tool_call_example_parses_with_verls_hermes_parser(shipped, qwen_tokenizer):
    """What the template tells the model to write is what verl's hermes parser turns into a search call."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    parser = ToolParser.get_tool_parser("hermes", qwen_tokenizer)
    block = re.search(r"<tool_call>.*?</tool_call>", shipped.templates["tool_call"].user, re.DOTALL).group(0)
    _, calls = await parser.extract_tool_calls(qwen_tokenizer.encode("<think>I need to look it up.</think>\n" + block))
    assert [c.name for c in calls] == ["search"]
    assert json.loads(calls[0].arguments) == _example_call(shipped)["arguments"]


def test_templates_name_registered_agent_loops(shipped):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import verl_search.agent_loop  # noqa: F401  (registers search_r1_agent, as the verl.plugins entry point does)

    for name, template in shipped.templates.items():
        assert template.agent_name in _agent_loop_registry, name


def test_render_substitutes_the_question_literally(shipped):
    messages = shipped.templates["tool_call"].render("what is {x}?")
    assert messages[-1]["content"].endswith("Question: what is {x}?")
    assert '{"name": "search"' in messages[-1]["content"]  # braces in the template are not format fields


GOOD = {"description": "d", "agent_name": "tool_agent", "user": "Q: {question}"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"default": "t", "templates": {"t": {**GOOD, "user": "no slot"}}}, "templates.t: Value error, user text"),
        ({"default": "t", "templates": {"t": {**GOOD, "user": "{question} {question}"}}}, "exactly once"),
        ({"default": "t", "templates": {"t": {**GOOD, "system": "{question}"}}}, "system text must not"),
        ({"default": "t", "templates": {"t": {**GOOD, "agent": "x"}}}, "templates.t.agent: Extra inputs"),
        ({"default": "t", "templates": {"t": {k: v for k, v in GOOD.items() if k != "agent_name"}}},
         "templates.t.agent_name: Field required"),
        ({"default": "other", "templates": {"t": GOOD}}, "default template 'other' is not defined"),
        ({"default": "t", "templates": {}}, "templates"),
        (["not", "a", "mapping"], "<top level>"),
    ],
)  # fmt: skip
def test_bad_template_files_are_refused_naming_the_key(content, message, tmp_path):
    path = tmp_path / "prompt.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(TemplateError, match=re.escape(message)):
        load_templates(path)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(TemplateError, match="cannot read template file"):
        load_templates(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("default: [unclosed\n")
    with pytest.raises(TemplateError, match="not valid YAML"):
        load_templates(bad)
