"""QuietTool: what ``SearchTool`` and ``AccessTool`` share as verl tools. They keep no per-trajectory state, so
``create``, ``calc_reward`` and ``release`` do nothing, and they are built without ``BaseTool.__init__``, which
prints the schema on stdout in every rollout worker."""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)


class QuietTool(BaseTool):
    """A stateless verl tool: subclasses validate their config, then call ``__init__`` here, and define ``execute``."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema) -> None:
        # what verl's BaseTool.__init__ does, without its print of the schema on stdout
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name
        logger.debug("%s %s: %s", type(self).__name__, self.name, tool_schema.model_dump_json(exclude_none=True))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
