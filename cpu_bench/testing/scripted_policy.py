"""A scripted stand-in for verl's LLM server manager, plus stock policies, for running verl's agent loops on CPU.

NO LANGUAGE MODEL RUNS HERE. A *policy* (plain Python) reads the decoded conversation so far and returns the next
assistant text; :class:`ScriptedServerManager` tokenises it and answers like a rollout server would (stop strings,
``max_tokens``, EOS, log-probs). Every call is recorded, so tests can check the trajectory token by token.
Invariant: the token ids returned for a call are exactly ``tokenizer.encode(text)`` (+ EOS when no stop string hit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl.workers.rollout.replica import TokenOutput

ASSISTANT_START = "<|im_start|>assistant\n"
#: what the prompt templates (``data_preprocess/prompt.yaml``) put before the question
QUESTION_MARK = "Question:"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class PolicyInput:
    """What a policy sees for one generation request."""

    conversation: str  # the prompt ids decoded with special tokens kept
    sampling_params: dict[str, Any]
    call_index: int  # 0 for the first generate call of this request id


Policy = Callable[[PolicyInput], str]
Reader = Callable[[str, str], str]  # (question, retrieved text) -> answer


@dataclass
class GenerateCall:
    """One recorded ``generate`` call: what verl sent and what the scripted model returned."""

    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    text: str
    token_ids: list[int]
    log_probs: list[float] | None


class ScriptedServerManager:
    """Duck-types verl's ``LLMServerClient.generate`` for agent loops; the "model" is ``policy``.

    ``honour_stop=False`` makes it ignore ``sampling_params["stop"]`` (a server that overshoots a stop string).
    A plain class on purpose: hydra's ``instantiate`` would turn a dataclass argument into a config node.
    """

    def __init__(self, tokenizer: Any, policy: Policy, *, honour_stop: bool = True, logprob: float = -0.25) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.honour_stop = honour_stop
        self.logprob = logprob
        self.calls: list[GenerateCall] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        conversation = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        call_index = sum(1 for c in self.calls if c.request_id == request_id)
        text = self.policy(PolicyInput(conversation, dict(sampling_params), call_index))
        if not isinstance(text, str):
            raise TypeError(f"policy must return the assistant text as str, got {type(text).__name__}")
        text, stopped = self._apply_stop(text, sampling_params)
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not stopped:
            token_ids.append(self.tokenizer.eos_token_id)  # the model ends its turn
        limit = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if limit is not None:
            token_ids = token_ids[: max(int(limit), 0)]
        log_probs = [self.logprob] * len(token_ids) if sampling_params.get("logprobs") else None
        self.calls.append(
            GenerateCall(request_id, list(prompt_ids), dict(sampling_params), text, list(token_ids), log_probs)
        )
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, num_preempted=0, stop_reason="completed")

    def _apply_stop(self, text: str, sampling_params: Mapping[str, Any]) -> tuple[str, bool]:
        stops = sampling_params.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if not self.honour_stop or not stops:
            return text, False
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if not hits:
            return text, False
        index, stop = min(hits)
        keep = sampling_params.get("include_stop_str_in_output") or sampling_params.get("no_stop_trim")
        return text[: index + len(stop)] if keep else text[:index], True


def question_of(conversation: str) -> str:
    """The question asked in the first user turn of a decoded chat (a first-turn prompt or a whole conversation): the
    text after the last ``Question:`` in that turn (where the prompt templates put it), else the whole turn.

    Tool results come back as later user turns, so only the first one is read. Raises ValueError when there is none.
    """
    match = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", conversation, re.DOTALL)
    if match is None:
        raise ValueError("conversation has no user turn")
    return match.group(1).rpartition(QUESTION_MARK)[2].strip()


def _response_part(conversation: str) -> str:
    """Everything after the first assistant header: what the model and the environment added."""
    if ASSISTANT_START not in conversation:
        return ""
    return conversation.split(ASSISTANT_START, 1)[1]


def retrieved_blocks(conversation: str, tag: str) -> list[str]:
    """Every ``<tag>…</tag>`` block after the first assistant header (what the environment returned), in order."""
    return re.findall(rf"<{tag}>(.*?)</{tag}>", _response_part(conversation), re.DOTALL)


def search_call(query: str, *, native: bool) -> str:
    """A call of the ``search`` tool on ``query``: ``<search>`` tags (native protocol) or a hermes ``<tool_call>``."""
    if native:
        return f"<search> {query} </search>"
    call = {"name": "search", "arguments": {"query_list": [query]}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def search_turn(query: str, *, native: bool, thought: str) -> str:
    """A scripted turn that thinks ``thought``, then searches ``query`` (see :func:`search_call`)."""
    return f"<think> {thought} </think>\n{search_call(query, native=native)}"


@dataclass(frozen=True)
class OracleReader:
    """ORACLE READER, not a model: answers the gold answer if it occurs in the retrieved text, else ``unknown``.

    It shows whether retrieval surfaced the answer; its accuracy is a retrieval recall, not a model's skill.
    """

    gold_answers: Mapping[str, Sequence[str]]  # question -> gold answers

    def __call__(self, question: str, retrieved: str) -> str:
        golds = self.gold_answers.get(question)
        if golds is None:
            matching = [q for q in self.gold_answers if q in question]
            golds = self.gold_answers[matching[0]] if matching else ()
        lowered = retrieved.lower()
        for gold in golds:
            if gold and gold.lower() in lowered:
                return gold
        return UNKNOWN


def _search_then_answer(reader: Reader, *, native: bool, search_thought: str, answer_thought: str) -> Policy:
    """Search the question until a result came back, then answer what ``reader`` finds in the last result."""
    result_tag = "information" if native else "tool_response"

    def policy(inp: PolicyInput) -> str:
        question = question_of(inp.conversation)
        retrieved = retrieved_blocks(inp.conversation, result_tag)
        if not retrieved:
            return search_turn(question, native=native, thought=search_thought)
        return f"<think> {answer_thought} </think>\n<answer> {reader(question, retrieved[-1])} </answer>"

    return policy


def tool_call_policy(reader: Reader) -> Policy:
    """``tool_agent`` protocol: first a hermes ``<tool_call>`` to ``search`` with the question, then an answer."""
    return _search_then_answer(
        reader, native=False, search_thought="I should search for this.", answer_thought="The search results help."
    )


def native_search_policy(reader: Reader) -> Policy:
    """Search-R1 protocol: ``<search> question </search>``, then ``<answer>`` from the ``<information>`` block."""
    return _search_then_answer(
        reader, native=True, search_thought="I need to search.", answer_thought="I found information."
    )


def scripted_turns(*texts: str) -> Policy:
    """A policy that replays ``texts`` in order per request (the last one repeats), ignoring the conversation."""
    if not texts:
        raise ValueError("scripted_turns needs at least one text")

    def policy(inp: PolicyInput) -> str:
        return texts[min(inp.call_index, len(texts) - 1)]

    return policy
