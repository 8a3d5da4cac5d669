"""Write a run's copy of a tool YAML with the retrieval URL (and any run settings) filled in: the one tool-YAML writer.

Invariant: the user's file is only read, never modified; the copy is written atomically (temp file + rename), so a
crash never leaves a half-written YAML where the launch expects one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from verl_search.atomic import atomic_path
from verl_search.errors import ConfigError

URL_KEY = "retrieval_service_url"
#: a run's copy of the tool YAML, in its run folder (the run scripts' Python step writes it)
RUN_TOOL_YAML = "search_tool_config.yaml"


def write_tool_config(
    source: Path, dest: Path, url: str | list[str], settings: Mapping[str, Any] | None = None
) -> Path:
    """Copy ``source`` to ``dest`` with ``config.retrieval_service_url`` (and ``settings``, e.g. ``{"topk": 3}``) set on
    every tool that declares that key; return ``dest``. ``source`` is never written; a YAML with no tool to receive
    the URL is a :class:`ConfigError` (the URL would be silently ignored otherwise)."""
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise ConfigError(f"tool config {source} does not exist")
    if source.resolve() == dest.resolve():
        raise ConfigError(f"refusing to overwrite the tool config {source} with its own run copy")
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"tool config {source} is not valid YAML: {str(e).splitlines()[0]}") from e
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list) or not tools:
        raise ConfigError(f"{source}: no 'tools:' list")
    configs = [t["config"] for t in tools if isinstance(t, dict) and isinstance(t.get("config"), dict)]
    configs = [c for c in configs if URL_KEY in c]
    if not configs:
        raise ConfigError(f"{source}: no tool has a 'config.{URL_KEY}' key to receive the retriever URL")
    for config in configs:
        config[URL_KEY] = url
        config.update(settings or {})
    changed = ", ".join([URL_KEY, *(settings or {})])
    header = f"# Generated from {source.resolve()} with {changed} set for this run; edit the source, not this copy.\n"
    with atomic_path(dest) as tmp:
        tmp.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return dest


def parse_urls(value: str) -> str | list[str]:
    """``a,b`` → ``[a, b]`` (several retrievers); a single URL stays a string."""
    urls = [u.strip() for u in value.split(",") if u.strip()]
    if not urls:
        raise ConfigError("the retriever URL is empty")
    return urls[0] if len(urls) == 1 else urls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the tool YAML to copy (never modified)")
    parser.add_argument("dest", type=Path, help="where to write the copy")
    parser.add_argument("--url", required=True, help="retriever URL, or several separated by commas")
    args = parser.parse_args(argv)
    try:
        write_tool_config(args.source, args.dest, parse_urls(args.url))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
