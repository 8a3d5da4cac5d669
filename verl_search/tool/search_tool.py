"""SearchTool (a verl ``BaseTool``) and ``run_search``: the boundary where search errors become model-facing text
(worded by ``tool.failures``).

Invariant: ``execute`` and ``run_search`` never raise for anything the model or the retriever does; every failure is
a short labelled text (``[search failed: <kind>] ...`` / ``[search error: invalid arguments] ...``) plus metrics.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_search.errors import SearchError
from verl_search.tool import failures
from verl_search.tool.arguments import extract_queries, fit_queries
from verl_search.tool.client import RetrievalClient
from verl_search.tool.config import SearchToolConfig
from verl_search.tool.formatting import format_results
from verl_search.tool.quiet_tool import QuietTool
from verl_search.tool.stats import STATS

logger = logging.getLogger(__name__)


@dataclass
class SearchOutcome:
    """What one search call produced: the model-facing text and what happened."""

    text: str
    ok: bool
    failure: str | None = None
    latency_s: float = 0.0
    num_queries: int = 0
    cached: int = 0  # queries answered from the cache or by joining an identical call in flight
    joined: int = 0  # of those, the ones that joined a call in flight
    notes: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failure": self.failure,
            "latency_s": self.latency_s,
            "num_queries": self.num_queries,
            "cached": self.cached,
            "joined": self.joined,
            "adjusted": len(self.notes),
        }


#: per-trajectory search statistics both loops keep in verl's ``extra_fields`` (they reach the reward's extra_info)
TRAJECTORY_STATS = ("search_calls", "search_failures", "search_latency_s", "search_cached", "invalid_actions")
#: per-call detail for the per-step training metrics (verl_search.monitor): latencies, queries, joined calls,
#: failures by kind, the native loop's wall time, where each ``tool_agent`` result was to go (its response tokens)
#: and its characters (verl cuts or silently drops a result that does not fit), results the native loop cut
CALL_LATENCIES = "search_call_latencies"
SEARCH_QUERIES = "search_queries"
SEARCH_JOINED = "search_joined"
FAILED_PREFIX = "search_failed_"
ROLLOUT_WALL_S = "rollout_wall_s"
RESULT_AT = "search_result_at"
RESULT_CHARS = "search_result_chars"
RESULTS_CUT = "search_results_cut"
RESULT_TOKENS_CUT = "search_result_tokens_cut"


def record_search(fields: dict[str, Any], outcome: SearchOutcome) -> None:
    """Add one search call to a trajectory's ``extra_fields`` (creating every key of TRAJECTORY_STATS)."""
    for key in TRAJECTORY_STATS:
        fields.setdefault(key, 0)
    fields["search_calls"] += 1
    fields["search_failures"] += 0 if outcome.ok else 1
    fields["search_latency_s"] += outcome.latency_s
    fields["search_cached"] += outcome.cached
    fields.setdefault(CALL_LATENCIES, []).append(round(outcome.latency_s, 6))
    fields[SEARCH_QUERIES] = fields.get(SEARCH_QUERIES, 0) + outcome.num_queries
    fields[SEARCH_JOINED] = fields.get(SEARCH_JOINED, 0) + outcome.joined
    if not outcome.ok and outcome.failure:
        key = FAILED_PREFIX + outcome.failure
        fields[key] = fields.get(key, 0) + 1


def record_result_place(fields: dict[str, Any], agent_data: Any, text: str) -> None:
    """Note where a result was to go in a ``tool_agent`` trajectory and how long it is (see ``RESULT_AT``)."""
    mask = getattr(agent_data, "response_mask", None)
    if isinstance(mask, list):
        fields.setdefault(RESULT_AT, []).append(len(mask))
        fields.setdefault(RESULT_CHARS, []).append(len(text))


def failure_text(error: SearchError, config: SearchToolConfig) -> str:
    """The stable text the model sees for a failed search call."""
    return failures.failure_text(error, failures.SEARCH, timeout=config.timeout)


async def run_search(config: SearchToolConfig, queries: Any) -> SearchOutcome:
    """Search ``queries`` (a list of strings, or anything the model sent) and return the text for the model."""
    started = time.perf_counter()  # not loop.time(): under uvloop it moves in whole ms, and only between iterations
    deadline = asyncio.get_running_loop().time() + config.timeout
    num_queries = len(queries) if isinstance(queries, list) else 0
    try:
        fitted = fit_queries(
            extract_queries(queries), max_queries=config.max_queries, max_query_chars=config.max_query_chars
        )
        num_queries = len(fitted.queries)
        client = RetrievalClient.shared(config)
        hits, cached, joined = await client.search(fitted.queries, config.topk, deadline=deadline)
        text = format_results(
            fitted.queries, hits, max_chars=config.max_result_chars, notes=fitted.notes, show_urls=config.show_urls
        )
        outcome = SearchOutcome(
            text=text, ok=True, num_queries=num_queries, cached=cached + joined, joined=joined, notes=fitted.notes
        )
    except SearchError as e:
        logger.debug("search failed (%s): %s", e.kind, e)
        outcome = SearchOutcome(text=failure_text(e, config), ok=False, failure=e.kind, num_queries=num_queries)
    except Exception as e:  # noqa: BLE001 - a bug must not crash a rollout; it is logged loudly and labelled
        logger.exception("unexpected error in search")
        outcome = SearchOutcome(
            text=failures.internal_text(e, failures.SEARCH),
            ok=False,
            failure="internal",
            num_queries=num_queries,
        )
    outcome.latency_s = time.perf_counter() - started
    STATS.log_interval = config.stats_log_interval
    STATS.record_call(latency_s=outcome.latency_s, num_queries=outcome.num_queries, failure=outcome.failure)
    return outcome


_frozen = False


def freeze_startup_objects() -> bool:
    """``gc.freeze()`` once per process (True when this call froze), so the collector stops walking the objects a
    rollout worker made before it searched (torch, verl, ...); the ``gc_freeze`` key asks for it: it is process-wide,
    and cyclic garbage among the frozen objects is never freed."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()  # what is garbage now is freed first, not frozen forever
    gc.freeze()
    return True


def default_tool_schema() -> OpenAIFunctionToolSchema:
    """The ``search`` function schema used when the YAML gives none (it matches tool_config/search_tool_config.yaml)."""
    query_list = {"type": "array", "items": {"type": "string"}, "description": "Search queries, one string each."}
    function = {
        "name": "search",
        "description": "Searches Wikipedia for relevant passages. Several queries can be sent at once.",
        "parameters": {"type": "object", "properties": {"query_list": query_list}, "required": ["query_list"]},
    }
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})


class SearchTool(QuietTool):
    """verl tool ``search`` (``class_name: verl_search.SearchTool``): ``{"query_list": [...]}`` → Search-R1 formatted
    passages. Construction only validates the config; the HTTP client is made on the first call."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        self.search_config = SearchToolConfig.from_dict(config)
        super().__init__(config, tool_schema or default_tool_schema())
        if self.search_config.gc_freeze:
            freeze_startup_objects()

    async def execute(self, instance_id: str, parameters: Any, **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        outcome = await run_search(self.search_config, parameters)
        # verl's ToolAgentLoop drops the metrics dict but keeps agent_data.extra_fields in the trajectory's output
        fields = getattr(kwargs.get("agent_data"), "extra_fields", None)
        if isinstance(fields, dict):
            record_search(fields, outcome)
            record_result_place(fields, kwargs.get("agent_data"), outcome.text)
        return ToolResponse(text=outcome.text), 0.0, outcome.metrics()
