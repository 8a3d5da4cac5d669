"""The README's long-horizon command: its knobs, run through the GPU script's dry run, give a run with both tools."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _readme_command() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("### Long-horizon agents", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    train = section.split("# train:", 1)[1]
    words = shlex.split(train.split("\n", 1)[1].replace("\\\n", " ").split(">", 1)[0])
    return words


def test_the_readme_long_horizon_command_trains_with_search_and_access(tmp_path):
    words = _readme_command()
    knobs = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
    assert words[len(knobs) :][:2] == ["nohup", "bash"]
    script = REPO / words[len(knobs) + 2]
    knobs = {k: v.replace("$HOME", str(tmp_path)) for k, v in knobs.items()}
    knobs["TOOL_CONFIG"] = str(REPO / knobs["TOOL_CONFIG"])
    (tmp_path / "fake" / "sglang").mkdir(parents=True)
    (tmp_path / "fake" / "sglang" / "__init__.py").touch()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | knobs
    env |= {"DRY_RUN": "1", "SKIP_PREFLIGHT": "1", "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "fake")}
    run = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=32" in run.stdout
    assert "data.max_response_length=16384" in run.stdout
    tool_yaml = tmp_path / "runs" / knobs["EXPERIMENT_NAME"] / "search_tool_config.yaml"
    tools = yaml.safe_load(tool_yaml.read_text())["tools"]
    assert [t["class_name"] for t in tools] == ["verl_search.SearchTool", "verl_search.AccessTool"]
    assert all(t["config"]["retrieval_service_url"] == "http://127.0.0.1:8000" for t in tools)
    assert tools[0]["config"]["show_urls"] is True
