"""verl-search: Search-R1 style search-agent RL on current verl.

Runtime plugin (imported by verl's workers): ``plugin``, ``tool/``, ``agent_loop``, ``reward``, over shared leaves
(``errors``, ``protocol``, ...); ``cpu/`` is verl's CPU backend, ``monitor/`` the trainer-side search metrics.
Tooling: ``data/``, ``launch/``, ``eval/``, ``report``. Imports point one way (tooling → runtime plugin → leaves)
and never reach ``cpu_bench``. Exports are lazy: verl imports this package while ``import verl`` is still running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "AccessTool",
    "AccessToolConfig",
    "SearchTool",
    "SearchToolConfig",
    "access_stats",
    "compute_score",
    "run_access",
    "run_search",
    "search_stats",
]

if TYPE_CHECKING:
    from verl_search.reward import compute_score
    from verl_search.tool.access_tool import AccessTool, run_access
    from verl_search.tool.config import AccessToolConfig, SearchToolConfig
    from verl_search.tool.search_tool import SearchTool, run_search

_LAZY = {
    "SearchTool": "verl_search.tool.search_tool",
    "run_search": "verl_search.tool.search_tool",
    "SearchToolConfig": "verl_search.tool.config",
    "AccessTool": "verl_search.tool.access_tool",
    "run_access": "verl_search.tool.access_tool",
    "AccessToolConfig": "verl_search.tool.config",
    "compute_score": "verl_search.reward",
}


def search_stats() -> dict[str, Any]:
    """This process's search counters: calls, failures by kind, cache hits, retries, latency percentiles."""
    from verl_search.tool.stats import STATS

    return STATS.snapshot()


def access_stats() -> dict[str, Any]:
    """This process's access counters: calls, urls asked, failures by kind, cache hits, retries, latency percentiles."""
    from verl_search.tool.stats import ACCESS_STATS

    return ACCESS_STATS.snapshot()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'verl_search' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
