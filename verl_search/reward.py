"""Search-R1 outcome reward for verl (``reward.custom_reward_function``): normalised match of the model's last answer.

Invariants: pure and deterministic; only the model's own text counts as an answer, a tag or a search: never retrieved
documents nor the texts ``search_r1_agent`` adds (mask 0) outside ``<information>``, which are the messages below or a
``final_turn_instruction`` it lists under ``LOOP_MESSAGES_KEY``; every call returns the same keys.
No ``from __future__ import annotations``: verl may load this file by path, where pydantic could not resolve them.
"""

import re
import string
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from verl_search.errors import ConfigError, validation_text

#: Search-R1's fixed protocol text for a turn with neither a search nor an answer (search_r1/llm_agent/generation.py)
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
#: the same message when the loop also reads pages (``<access>``, ASearcher's protocol)
INVALID_ACTION_MESSAGE_WITH_ACCESS = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to read a page, I should put its url between <access> and </access>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
#: added before the last turn unless the agent-loop YAML sets ``final_turn_instruction``
FINAL_TURN_INSTRUCTION = (
    "\nI have used all my searches. I must now give the final answer between <answer> and </answer>.\n"
)
#: the trajectory's ``extra_fields`` key (the reward's ``extra_info``) listing the messages the loop added
LOOP_MESSAGES_KEY = "loop_messages"
#: what the loop says with no agent-loop YAML: the reward removes these even when ``extra_info`` lists nothing
DEFAULT_LOOP_MESSAGES = (INVALID_ACTION_MESSAGE, INVALID_ACTION_MESSAGE_WITH_ACCESS, FINAL_TURN_INSTRUCTION)
#: keyword arguments verl's reward managers add on their own; they carry nothing for this reward
_FRAMEWORK_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})

_RETRIEVED = re.compile(r"<(information|tool_response)>(.*?)(?:</\1>|\Z)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SEARCH_BLOCK = re.compile(r"<search>.*?</search>|<tool_call>.*?</tool_call>", re.DOTALL)
_ACCESS_BLOCK = re.compile(r"<access>.*?</access>", re.DOTALL)  # the native loop's page reads (ASearcher)
_STRUCTURE_TAG = re.compile(r"<(/?)(think|search|access|tool_call|answer)>")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class RewardOptions(BaseModel):
    """Options set through ``reward.custom_reward_function.reward_kwargs``; the defaults give plain Search-R1 EM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Literal["em", "subem", "f1"] = Field(
        default="em", description="Which match of the final answer becomes the score: exact, gold-in-answer, or F1."
    )
    structure_format_score: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Earned by a well-formed response whose answer is wrong or missing; a correct answer in an "
        "ill-formed response loses it (Search-R1's structured reward).",
    )
    final_format_score: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Earned by an ill-formed response that does give a (wrong) answer."
    )
    retrieval_score: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Added when gold was retrieved but the well-formed answer is wrong."
    )
    no_search_penalty: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Subtracted (floor 0) from a response that never searched."
    )
    strict_single_answer: bool = Field(default=False, description="Score 0 when the model writes several <answer>s.")
    max_answer_tags: int = Field(default=10, ge=1, description="More <answer> tags than this scale the score down.")
    tag_spam_factor: float = Field(
        default=0.25, ge=0.0, le=1.0, description="Factor applied to the score when max_answer_tags is exceeded."
    )

    @model_validator(mode="after")
    def _wrong_never_beats_right(self) -> "RewardOptions":
        if self.structure_format_score + self.retrieval_score >= 1.0:
            raise ValueError(
                "structure_format_score + retrieval_score must stay below 1 (the score of a correct answer)"
            )
        return self


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the words a/an/the, collapse whitespace (Search-R1/SQuAD)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def gold_answers(ground_truth: Any) -> tuple[str, ...]:
    """Gold answers from ``{"target": ...}``, a list/tuple/numpy array of strings, or one string."""
    if isinstance(ground_truth, Mapping):
        if "target" not in ground_truth:
            raise ValueError(f"ground_truth dict has no 'target' key (keys: {sorted(ground_truth)})")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, str):
        items: Any = [ground_truth]
    elif hasattr(ground_truth, "tolist"):
        items = ground_truth.tolist()
        items = items if isinstance(items, list) else [items]
    elif isinstance(ground_truth, list | tuple):
        items = ground_truth
    else:
        raise ValueError(f"ground_truth must be a dict with 'target', a list or a string, not {type(ground_truth)}")
    answers = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(f"gold answers must be strings, got {type(item).__name__}: {item!r}")
        answers.append(str(item))
    if not answers:
        raise ValueError("ground_truth holds no gold answer")
    return tuple(answers)


def _f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = prediction.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def answer_metrics(prediction: str, golds: tuple[str, ...]) -> dict[str, float]:
    """em, subem and f1 of ``prediction`` against the best gold; golds normalising to nothing never match."""
    pred = normalize_answer(prediction)
    normalized = [g for g in (normalize_answer(gold) for gold in golds) if g]
    if not pred or not normalized:
        return {"em": 0.0, "subem": 0.0, "f1": 0.0}
    return {
        "em": float(any(pred == gold for gold in normalized)),
        "subem": float(any(gold in pred for gold in normalized)),
        "f1": max(_f1(pred, gold) for gold in normalized),
    }


def _well_formed(own_text: str, answer_count: int) -> bool:
    """Tags balanced and never nested, exactly one answer block, and nothing but whitespace after it."""
    if answer_count != 1:
        return False
    open_tag = None
    for match in _STRUCTURE_TAG.finditer(own_text):
        closing, name = match.group(1) == "/", match.group(2)
        if closing != (open_tag is not None) or (closing and name != open_tag):
            return False
        open_tag = None if closing else name
    return open_tag is None and not own_text[own_text.rindex("</answer>") + len("</answer>") :].strip()


def model_text(solution_str: str, loop_messages: tuple[str, ...] = DEFAULT_LOOP_MESSAGES) -> str:
    """The model's own writing: retrieved blocks and the loop's messages (also one cut off by the response length,
    once the cut part quotes a tag) become a newline."""
    text = _RETRIEVED.sub("\n", solution_str)
    messages = [m for m in loop_messages if m]
    for message in messages:
        text = text.replace(message, "\n")
    for message in messages:
        first_tag = message.find("<")
        if first_tag < 0:
            continue  # quotes no tag: a cut-off copy cannot be miscounted
        for length in range(len(message) - 1, first_tag, -1):
            if text.endswith(message[:length]):
                return text[:-length] + "\n"
    return text


def _loop_messages(extra_info: Any) -> tuple[str, ...]:
    listed = extra_info.get(LOOP_MESSAGES_KEY) if isinstance(extra_info, Mapping) else None
    if isinstance(listed, str) or not hasattr(listed, "__iter__"):
        return DEFAULT_LOOP_MESSAGES
    return DEFAULT_LOOP_MESSAGES + tuple(m for m in listed if isinstance(m, str) and m not in DEFAULT_LOOP_MESSAGES)


def _options(kwargs: Mapping[str, Any]) -> RewardOptions:
    try:
        return RewardOptions(**{k: v for k, v in kwargs.items() if k not in _FRAMEWORK_KWARGS})
    except ValidationError as e:
        raise ConfigError(f"reward option {validation_text(e)}") from e


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> dict[str, float]:
    """Score one response (verl's custom reward signature); ``kwargs`` are :class:`RewardOptions` fields.

    The final answer is the last ``<answer>`` of the model's own text (:func:`model_text`), scored by ``metric`` and
    the format rules. Returns ``score``, its ``em``/``subem``/``f1``, ``answered``, ``num_searches``,
    ``failed_searches``, ``gold_in_results`` and the loop's ``search_latency_s``/``search_cached`` (0.0 when absent).
    """
    options = _options(kwargs)
    if not isinstance(solution_str, str):
        raise TypeError(f"solution_str must be a string, got {type(solution_str).__name__}")
    golds = gold_answers(ground_truth)
    retrieved = [m.group(2) for m in _RETRIEVED.finditer(solution_str)]
    own_text = model_text(solution_str, _loop_messages(extra_info))
    answers = _ANSWER.findall(own_text)
    answered = bool(answers)
    metrics = answer_metrics(answers[-1].strip(), golds) if answered else {"em": 0.0, "subem": 0.0, "f1": 0.0}

    gold_retrieved = gold_in_text(retrieved, golds)
    value = metrics[options.metric]
    tag_spam = max(own_text.count("<answer>"), own_text.count("</answer>")) > options.max_answer_tags
    base = value * options.tag_spam_factor if tag_spam else value
    if options.strict_single_answer and len(answers) > 1:
        score = 0.0
    elif _well_formed(own_text, len(answers)):
        bonus = options.retrieval_score if gold_retrieved else 0.0
        score = max(base, options.structure_format_score + bonus)
    elif base > 0:
        score = max(base - options.structure_format_score, 0.0)
    else:
        score = options.final_format_score if answered else 0.0
    searches = len(_SEARCH_BLOCK.findall(own_text))
    if not searches and not _ACCESS_BLOCK.search(own_text):  # reading a page uses the search engine too
        score = max(score - options.no_search_penalty, 0.0)
    return {
        "score": float(score),
        **metrics,
        "answered": float(answered),
        "num_searches": float(searches),
        "failed_searches": float(sum(text.count("[search failed:") for text in retrieved)),
        "gold_in_results": float(gold_retrieved),
        "search_latency_s": _stat(extra_info, "search_latency_s"),
        "search_cached": _stat(extra_info, "search_cached"),
    }


def _stat(extra_info: Any, key: str) -> float:
    value = extra_info.get(key) if isinstance(extra_info, Mapping) else None
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def gold_in_text(retrieved: list[str], golds: tuple[str, ...] | list[str]) -> bool:
    """Whether a gold answer occurs, as whole words normalised as EM normalises, in any retrieved text."""
    normalized = [g for g in (normalize_answer(str(gold)) for gold in golds) if g]
    padded = [f" {normalize_answer(t)} " for t in retrieved]
    return any(f" {gold} " in text for text in padded for gold in normalized)
