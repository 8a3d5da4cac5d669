"""``search_r1_agent``: Search-R1's native ``<search>``/``<information>`` protocol as a verl agent loop, and with an
access config ASearcher's too (``<access> url </access>`` reads a page, window by window).

The model writes ``<search> q </search>``, ``<access> url </access>`` (generation stops there) or
``<answer> … </answer>``; results come back as ``\\n\\n<information>…</information>\\n\\n``. Invariants: the model's
tokens are kept exactly as generated (never re-tokenised, mask 1, their log-probs); every token the loop adds
(results, the corrective message for an invalid action, the last-turn instruction) has mask 0; the response never
exceeds ``rollout.response_length``, and with ``final_answer_tokens`` set the last turn always has that many tokens;
tool errors become the same labelled text as :class:`verl_search.SearchTool` and :class:`verl_search.AccessTool`
show (via ``run_search``/``run_access``).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, ToolListWrap, register
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from verl_search.errors import ConfigError
from verl_search.reward import (
    FINAL_TURN_INSTRUCTION,
    INVALID_ACTION_MESSAGE,
    INVALID_ACTION_MESSAGE_WITH_ACCESS,
    LOOP_MESSAGES_KEY,
)
from verl_search.tool.access_forms import NATIVE
from verl_search.tool.access_record import record_access
from verl_search.tool.access_tool import run_access
from verl_search.tool.config import AccessToolConfig, SearchToolConfig
from verl_search.tool.search_tool import (
    RESULT_TOKENS_CUT,
    RESULTS_CUT,
    ROLLOUT_WALL_S,
    TRAJECTORY_STATS,
    freeze_startup_objects,
    record_search,
    run_search,
)

logger = logging.getLogger(__name__)

AGENT_NAME = "search_r1_agent"
STOP_STRINGS = ("</search>", "</answer>")
ACCESS_STOP = "</access>"
#: the reserve kept for the last turn when the loop reads pages and ``final_answer_tokens`` is unset
ACCESS_FINAL_ANSWER_TOKENS = 256
#: per-trajectory counts of the native loop beside the search and access stats: page windows cut to fit the
#: response, their tokens cut, and last turns brought on by the context reserve rather than the turn count
ACCESS_RESULTS_CUT = "access_results_cut"
ACCESS_RESULT_TOKENS_CUT = "access_result_tokens_cut"
RESERVE_FINAL_TURNS = "reserve_final_turns"
# What verl's AgentLoopWorker passes to every loop; any other key comes from the agent-loop YAML and must be ours.
_BASE_KWARGS = frozenset(
    {"trainer_config", "server_manager", "tokenizer", "processor", "dataset_cls", "data_config", "hf_model_type"}
)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ACTION_WITH_ACCESS = re.compile(r"<(search|access|answer)>(.*?)</\1>", re.DOTALL)


class SearchR1LoopConfig(BaseModel):
    """Keys an ``agent_loop_config_path`` YAML entry may set for ``search_r1_agent`` (besides ``name``/``_target_``)."""

    model_config = ConfigDict(extra="forbid")

    search: dict[str, Any] | None = Field(
        default=None,
        description="SearchToolConfig keys for this loop. Unset: use the config of the tool named `tool_name` "
        "loaded from actor_rollout_ref.rollout.multi_turn.tool_config_path (same YAML as the tool_agent setup).",
    )
    tool_name: str = Field(default="search", description="Tool whose config is reused when `search` is unset.")
    access: dict[str, Any] | None = Field(
        default=None,
        description="AccessToolConfig keys: turns on <access> url </access> (ASearcher's protocol). Unset: the config "
        "of the tool named `access_tool_name` in the tool YAML, if it has one; else the loop has no <access>.",
    )
    access_tool_name: str | None = Field(
        default="access", description="Tool whose config is reused when `access` is unset; null = never look."
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        description="Assistant turns per trajectory; the last one may only answer (so max_turns-1 searches). "
        "Unset: actor_rollout_ref.rollout.multi_turn.max_assistant_turns, else 4. Nothing caps it (128 works).",
    )
    final_answer_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Response tokens kept for a last answer turn: no turn but the last writes into them, and once "
        "a result would leave fewer the loop cuts it, adds final_turn_instruction and gives the model its last "
        f"turn. 0 = Search-R1's rule (a result is cut at response_length and the trajectory ends). Unset: 0 "
        f"without access, {ACCESS_FINAL_ANSWER_TOKENS} with it.",
    )
    final_turn_instruction: str = Field(
        default=FINAL_TURN_INSTRUCTION,
        description="Added (mask 0) before the last turn, after the last search results or corrective message; "
        "listed in the trajectory's extra_fields so the reward does not read its tags as the model's.",
    )


def parse_action(text: str, *, access: bool = False) -> tuple[str | None, str]:
    """Search-R1's rule: the first well-formed ``<search>…</search>`` or ``<answer>…</answer>`` (or, with
    ``access``, ``<access>…</access>``) wins."""
    match = (_ACTION_WITH_ACCESS if access else _ACTION).search(text)
    if match is None:
        return None, ""
    return match.group(1), match.group(2).strip()


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


@register(AGENT_NAME)
class SearchR1AgentLoop(AgentLoopBase):
    """Search-R1 multi-turn rollout: generate → ``<search>`` → retrieve → ``<information>`` → … → ``<answer>``.

    Search statistics go to ``extra_fields`` (verl's ``AgentLoopMetrics`` holds fixed timings only), which reach the
    reward as ``extra_info``; time spent searching is also added to the ``tool_calls`` timing.
    """

    def __init__(self, *args: Any, tools: ToolListWrap | None = None, **kwargs: Any) -> None:
        kwargs.pop("name", None)  # the agent_loop_config_path entry's own name
        options = {k: _plain(kwargs.pop(k)) for k in list(kwargs) if k not in _BASE_KWARGS}
        try:
            self.options = SearchR1LoopConfig(**options)
        except ValueError as e:
            raise ConfigError(f"invalid {AGENT_NAME} options in the agent loop config: {e}") from e
        super().__init__(*args, **kwargs)
        self.search_config = self._search_config(tools)
        if self.search_config.gc_freeze:
            freeze_startup_objects()
        self.access_config = self._access_config(tools)
        if self.access_config is not None and not self.search_config.show_urls:
            logger.warning("%s reads pages but its search config has show_urls: false: results show no url", AGENT_NAME)
        self.stop_strings = STOP_STRINGS + ((ACCESS_STOP,) if self.access_config else ())
        self.invalid_action_message = (
            INVALID_ACTION_MESSAGE_WITH_ACCESS if self.access_config else INVALID_ACTION_MESSAGE
        )
        multi_turn = self.rollout_config.multi_turn
        self.max_turns = self.options.max_turns or multi_turn.get("max_assistant_turns") or 4
        self.response_length = self.rollout_config.response_length
        self.final_ids = self._encode(self.options.final_turn_instruction)
        self.hold = self._held_back_tokens()
        self.backend = self.rollout_config.get("name")
        if self.backend == "sglang" and self.rollout_config.get("skip_tokenizer_init", False):
            raise ConfigError(
                f"{AGENT_NAME} stops generation at {' and '.join(self.stop_strings)}, and SGLang matches stop strings "
                "only with its tokenizer loaded: set actor_rollout_ref.rollout.skip_tokenizer_init=False (the run "
                "scripts do) or use actor_rollout_ref.rollout.name=vllm"
            )

    def _search_config(self, tools: ToolListWrap | None) -> SearchToolConfig:
        if self.options.search is not None:
            return SearchToolConfig.from_dict(self.options.search)
        for tool in tools.tools if tools else []:
            if getattr(tool, "name", None) == self.options.tool_name and hasattr(tool, "search_config"):
                return tool.search_config
        raise ConfigError(
            f"{AGENT_NAME} has no search config: set actor_rollout_ref.rollout.multi_turn.tool_config_path to a tool "
            f"YAML with a '{self.options.tool_name}' tool (class_name: verl_search.SearchTool), or give `search:` "
            f"in its agent_loop_config_path entry"
        )

    def _access_config(self, tools: ToolListWrap | None) -> AccessToolConfig | None:
        if self.options.access is not None:
            return AccessToolConfig.from_dict(self.options.access)
        for tool in tools.tools if tools and self.options.access_tool_name else []:
            if getattr(tool, "name", None) == self.options.access_tool_name and hasattr(tool, "access_config"):
                return tool.access_config
        return None

    def _held_back_tokens(self) -> int:
        """Tokens no turn but the last may use: the answer reserve plus the final-turn instruction (0 = none)."""
        reserve = self.options.final_answer_tokens
        if reserve is None:
            reserve = ACCESS_FINAL_ANSWER_TOKENS if self.access_config else 0
        if not reserve:
            return 0
        hold = reserve + len(self.final_ids)
        if hold >= self.response_length:
            raise ConfigError(
                f"{AGENT_NAME}: final_answer_tokens={reserve} plus the final-turn instruction ({len(self.final_ids)} "
                f"tokens) leave nothing of actor_rollout_ref.rollout.response_length={self.response_length}: lower "
                "final_answer_tokens in the agent_loop_config_path entry (0 turns the reserve off)"
            )
        return hold

    def _stop_params(self, budget: int) -> dict[str, Any]:
        """Stop at ``</search>``/``</answer>`` (and ``</access>``) keeping the stop string in the text as in the
        tokens; each engine rejects the other's flag, so exactly one is sent."""
        params: dict[str, Any] = {"stop": list(self.stop_strings), "max_tokens": budget}
        if self.backend == "vllm":
            params["include_stop_str_in_output"] = True
        elif self.backend == "sglang":
            params["no_stop_trim"] = True
        return params

    def _cut_after_action(self, token_ids: list[int]) -> int:
        """Length of the shortest prefix whose text completes a stop string (guards against a server overshooting)."""

        def has_stop(n: int) -> bool:
            text = self.tokenizer.decode(token_ids[:n], skip_special_tokens=False)
            return any(s in text for s in self.stop_strings)

        if not has_stop(len(token_ids)):
            return len(token_ids)
        low, high = 1, len(token_ids)
        while low < high:
            mid = (low + high) // 2
            if has_stop(mid):
                high = mid
            else:
                low = mid + 1
        return low

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _observe(self, action: str | None, content: str, stats: dict[str, Any], messages: list[str]) -> str:
        """Run the turn's action and return what the model reads next; its stats go into ``stats``."""
        if action == "search":
            outcome = await run_search(self.search_config, [content])
            record_search(stats, outcome)
            return _wrap(outcome.text)
        if action == "access" and self.access_config is not None:
            page = await run_access(self.access_config, content, NATIVE)
            record_access(stats, page, page.url)
            return _wrap(page.text)
        stats["invalid_actions"] += 1
        _note_message(messages, self.invalid_action_message)
        return self.invalid_action_message

    def _fit(self, observation: str, last_turn: bool, left: int) -> tuple[list[int], int, bool]:
        """The tokens added after a turn (its observation, then the final-turn instruction before the last turn), the
        observation's tokens cut to fit, and whether the reserve (not the turn count) made the next turn the last."""
        if not self.hold:  # Search-R1's rule: cut at the response length; the instruction only by turn count
            full_ids = self._encode(observation + (self.options.final_turn_instruction if last_turn else ""))
            return full_ids[:left], max(len(full_ids) - left, 0), False
        full_ids = self._encode(observation)
        by_reserve = not last_turn and left - len(full_ids) <= self.hold  # no room for another turn before it
        if not (last_turn or by_reserve):
            return full_ids, 0, False
        room = max(left - self.hold, 0)
        return full_ids[:room] + self.final_ids, max(len(full_ids) - room, 0), by_reserve

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        started = time.monotonic()
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        priority = int(priority)
        request_id = f"det-{priority}" if self.rollout_config.get("full_determinism", False) else uuid4().hex
        response_ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] | None = []
        timing: dict[str, float] = {}
        stats: dict[str, Any] = dict.fromkeys((*TRAJECTORY_STATS, RESULTS_CUT, RESULT_TOKENS_CUT), 0)
        if self.access_config is not None:
            stats.update(dict.fromkeys((ACCESS_RESULTS_CUT, ACCESS_RESULT_TOKENS_CUT), 0))
        if self.hold:
            stats[RESERVE_FINAL_TURNS] = 0
        num_preempted = 0
        assistant_turns = observations = 0
        last_turn = self.max_turns <= 1
        loop_messages: list[str] = []  # what the loop said outside <information>, for the reward to skip
        weight_steps: dict[str, Any] = {}  # min/max global_steps of the weights that wrote this trajectory

        while len(response_ids) < self.response_length:
            left = self.response_length - len(response_ids)
            budget = left if last_turn else left - self.hold  # only the last turn may write into the reserve
            params = {**sampling_params, **self._stop_params(budget)}
            with simple_timer("generate_sequences", timing):
                output = await self.server_manager.generate(
                    request_id=request_id,
                    prompt_ids=prompt_ids + response_ids,
                    sampling_params=params,
                    priority=priority,
                )
            assistant_turns += 1
            num_preempted += output.num_preempted or 0
            _note_weight_steps(weight_steps, output.extra_fields)
            keep = min(self._cut_after_action(list(output.token_ids)), budget)
            turn_ids = list(output.token_ids[:keep])
            response_ids += turn_ids
            mask += [1] * len(turn_ids)
            if logprobs is not None and output.log_probs is not None:
                logprobs += list(output.log_probs[:keep])
            else:
                logprobs = None

            text = self.tokenizer.decode(turn_ids, skip_special_tokens=True)
            action, content = parse_action(text, access=self.access_config is not None)
            if action == "answer" or last_turn or len(response_ids) >= self.response_length:
                break
            with simple_timer("tool_calls", timing):
                observation = await self._observe(action, content, stats, loop_messages)
            last_turn = assistant_turns + 1 >= self.max_turns
            obs_ids, cut, by_reserve = self._fit(observation, last_turn, self.response_length - len(response_ids))
            if by_reserve:
                stats[RESERVE_FINAL_TURNS] += 1
            last_turn = last_turn or by_reserve
            if last_turn:
                _note_message(loop_messages, self.options.final_turn_instruction)
            if cut and action in ("search", "access"):  # the result does not fit: what the model missed
                prefix = "search" if action == "search" else "access"
                stats[RESULTS_CUT if prefix == "search" else ACCESS_RESULTS_CUT] += 1
                stats[RESULT_TOKENS_CUT if prefix == "search" else ACCESS_RESULT_TOKENS_CUT] += cut
            observations += 1
            response_ids += obs_ids
            mask += [0] * len(obs_ids)
            if logprobs is not None:
                logprobs += [0.0] * len(obs_ids)

        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            num_turns=1 + assistant_turns + observations,
            metrics={**timing, "num_preempted": num_preempted},
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                **weight_steps,
                **stats,
                LOOP_MESSAGES_KEY: loop_messages,
                ROLLOUT_WALL_S: time.monotonic() - started,  # the share of it spent in search: verl_search.monitor
            },
        )


def _wrap(text: str) -> str:
    return f"\n\n<information>{text.strip()}</information>\n\n"


def _note_message(seen: list[str], message: str) -> None:
    if message and message not in seen:
        seen.append(message)


def _note_weight_steps(seen: dict[str, Any], extra: dict[str, Any]) -> None:
    """Keep the lowest ``min_global_steps`` and highest ``max_global_steps`` a server reported (verl reads both)."""
    for key, pick in (("min_global_steps", min), ("max_global_steps", max)):
        value = extra.get(key)
        if value is not None:
            seen[key] = value if seen.get(key) is None else pick(seen[key], value)
