"""verl-search: Search-R1 style search-agent RL on current verl.

verl's worker processes import the runtime plugin: ``plugin`` (the ``verl.plugins`` entry point), ``tool/``,
``agent_loop`` and ``reward``, over shared leaves (``errors``, ``protocol``, ``loop_messages``, ``atomic``, ...);
``cpu/`` is verl's CPU platform and rollout backend, ``monitor/`` the trainer-side search metrics. People run the
tooling: ``data/`` (preprocessing), ``launch/`` (preflight, tool YAML, run-script knobs), ``eval/`` and ``report``.
Imports point one way (tooling → runtime plugin → leaves) and never reach the CPU test bench (``cpu_bench``).

Exports are lazy: verl imports this package through its entry point while ``import verl`` is still running, so it
must stay cheap and cannot risk a circular import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["SearchTool", "SearchToolConfig", "compute_score", "run_search", "search_stats"]

if TYPE_CHECKING:
    from verl_search.reward import compute_score
    from verl_search.tool.config import SearchToolConfig
    from verl_search.tool.search_tool import SearchTool, run_search

_LAZY = {
    "SearchTool": "verl_search.tool.search_tool",
    "run_search": "verl_search.tool.search_tool",
    "SearchToolConfig": "verl_search.tool.config",
    "compute_score": "verl_search.reward",
}


def search_stats() -> dict[str, Any]:
    """This process's search counters: calls, failures by kind, cache hits, retries, latency percentiles."""
    from verl_search.tool.stats import STATS

    return STATS.snapshot()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'verl_search' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
