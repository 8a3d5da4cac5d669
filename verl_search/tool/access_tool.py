"""AccessTool (a verl ``BaseTool``, tool ``access``) and ``run_access``: the boundary where errors of opening a page
become model-facing text (worded by ``tool.failures``). A page is read one window at a time (``tool.windows``).

Invariant: ``execute`` and ``run_access`` never raise for anything the model or the retriever does; every failure is
a short labelled text (``[access failed: <kind>] ...`` / ``[access error: invalid arguments] ...``) plus metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_search.errors import InvalidArguments, PageNotFound, SearchError
from verl_search.tool import failures
from verl_search.tool.access_arguments import parse_access
from verl_search.tool.access_client import AccessClient
from verl_search.tool.access_forms import TOOL_CALL, AccessForm
from verl_search.tool.access_record import record_access
from verl_search.tool.config import AccessToolConfig
from verl_search.tool.quiet_tool import QuietTool
from verl_search.tool.stats import ACCESS_STATS
from verl_search.tool.windows import windows

logger = logging.getLogger(__name__)


@dataclass
class AccessOutcome:
    """What one access call produced: the model-facing text and what happened."""

    text: str
    ok: bool
    failure: str | None = None
    latency_s: float = 0.0
    page: int = 0  # the window read (1-based; 0 when none was)
    windows: int = 0  # how many windows the page has (0 when it was not read)
    cached: bool = False  # the page came from the cache
    joined: bool = False  # the page came from an identical call in flight
    url: str | None = None  # the url asked for (None when the arguments named none)

    def metrics(self) -> dict[str, Any]:
        metrics = {
            "ok": self.ok,
            "failure": self.failure,
            "access/calls": 1,
            "access/windows_read": 1 if self.ok else 0,
            "access/latency_s": self.latency_s,
            "access/cache_hits": int(self.cached),
            "access/joined": int(self.joined),
            "access/page": self.page,
            "access/windows": self.windows,
        }
        if self.failure:
            metrics[f"access/failed/{self.failure}"] = 1
        return metrics


async def run_access(config: AccessToolConfig, parameters: Any, form: AccessForm = TOOL_CALL) -> AccessOutcome:
    """Open the window of a page that ``parameters`` (``{"url": ..., "page": n}``, or anything the model sent) asks
    for and return the text for the model; hints and messages name calls in ``form``, the model's protocol."""
    started = time.perf_counter()  # not loop.time(): under uvloop it moves in whole ms, and only between iterations
    deadline = asyncio.get_running_loop().time() + config.timeout
    asked = 0
    url = None
    try:
        request = parse_access(parameters, form.expected)
        asked, url = 1, request.url
        client = AccessClient.shared(config)
        page, cached, joined = await client.page(request.url, deadline=deadline)
        if page is None:
            raise PageNotFound(f"no page for {request.url}")
        shown = windows(page, request.url, config.max_result_chars, form)
        if request.page > len(shown):
            raise InvalidArguments(
                f"page {request.page} is past the end: this url has {len(shown)} window(s), pages 1 to {len(shown)}; "
                f"{form.expected}"
            )
        outcome = AccessOutcome(
            text=shown[request.page - 1],
            ok=True,
            page=request.page,
            windows=len(shown),
            cached=cached and not joined,
            joined=joined,
        )
    except SearchError as e:
        logger.debug("access failed (%s): %s", e.kind, e)
        text = failures.failure_text(e, failures.ACCESS, timeout=config.timeout)
        outcome = AccessOutcome(text=text, ok=False, failure=e.kind)
    except Exception as e:  # noqa: BLE001 - a bug must not crash a rollout; it is logged loudly and labelled
        logger.exception("unexpected error in access")
        outcome = AccessOutcome(text=failures.internal_text(e, failures.ACCESS), ok=False, failure="internal")
    outcome.latency_s = time.perf_counter() - started
    outcome.url = url
    ACCESS_STATS.log_interval = config.stats_log_interval
    ACCESS_STATS.record_call(latency_s=outcome.latency_s, num_queries=asked, failure=outcome.failure)
    return outcome


def default_tool_schema() -> OpenAIFunctionToolSchema:
    """The ``access`` function schema used when the YAML gives none (it matches
    tool_config/search_access_tool_config.yaml)."""
    properties = {
        "url": {"type": "string", "description": "The url of a page, as a search result gives it."},
        "page": {
            "type": "integer",
            "description": "Which window of the page to read: 1 (the default) is the first.",
        },
    }
    function = {
        "name": "access",
        "description": "Opens the page at a url and returns one window of its text; long pages span several windows.",
        "parameters": {"type": "object", "properties": properties, "required": ["url"]},
    }
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})


class AccessTool(QuietTool):
    """verl tool ``access`` (``class_name: verl_search.AccessTool``): ``{"url": ..., "page": n}`` → window n of the
    page's text. Construction only validates the config; the HTTP client is made on the first call."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        self.access_config = AccessToolConfig.from_dict(config)
        super().__init__(config, tool_schema or default_tool_schema())

    async def execute(self, instance_id: str, parameters: Any, **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        outcome = await run_access(self.access_config, parameters)
        # verl's ToolAgentLoop drops the metrics dict but keeps agent_data.extra_fields in the trajectory's output
        fields = getattr(kwargs.get("agent_data"), "extra_fields", None)
        if isinstance(fields, dict):
            record_access(fields, outcome, outcome.url)
        return ToolResponse(text=outcome.text), 0.0, outcome.metrics()
