"""TEST KIT: an opening policy for the CPU rollout server, so CI exercises search and reward with a random model.

A random tiny model never writes a tool call nor a right answer, so GRPO would see no search and all-zero advantages.
Named by ``engine_kwargs.hf_cpu.opening_policy`` (``{path: cpu_bench.testing.forced_prefix.ForcedOpenings,
search_every: 2, answer: Paris, answer_every: 1, record_dir: DIR}``), it makes every k-th first-turn request open with
a real search call on the prompt's question, and every k-th request that follows a search result open with
``<answer> TEXT </answer>``. Exactly those tokens are forced; they are scored with the model's real log-probs, and
everything after them is the model's own sampling. With ``record_dir`` it also appends each server event (start,
weight update with the weights' fingerprint, generate call) as a JSON line to ``DIR/server-<replica>-<pid>.jsonl``.
Invariant: nothing is forced unless a ``*_every`` setting asks for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cpu_bench.testing.scripted_policy import QUESTION_MARK, question_of, search_call

RESULT_MARKERS = ("</tool_response>", "</information>")
POLICY_PATH = "cpu_bench.testing.forced_prefix.ForcedOpenings"


def search_opening(prompt_text: str, question: str) -> str:
    """A search call in the prompt's protocol: hermes JSON when the prompt lists tools, else Search-R1 tags."""
    return search_call(question, native="<tools>" not in prompt_text)


class ForcingSettings(BaseModel):
    """The keyword arguments of ``opening_policy`` beside its ``path``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    search_every: int = Field(
        0,
        ge=0,
        description="every k-th first-turn request starts with a forced, real search call on the question "
        "(hermes <tool_call> when the prompt lists tools, else <search>); 0 = never",
    )
    answer: str | None = Field(None, description="text of a forced '<answer>...</answer>' opening")
    answer_every: int = Field(0, ge=0, description="every k-th request that follows a search result starts with it")
    record_dir: str | None = Field(None, description="folder where each server appends a JSON line per event")


class ForcedOpenings:
    """Decides, per request, which opening (if any) to force; counts first turns and post-result turns apart."""

    def __init__(self, replica_rank: int = 0, **settings: Any) -> None:
        self.settings = ForcingSettings(**settings)
        self.first_turns = 0
        self.after_results = 0
        self._record_path: Path | None = None
        if self.settings.record_dir:
            Path(self.settings.record_dir).mkdir(parents=True, exist_ok=True)
            self._record_path = Path(self.settings.record_dir) / f"server-{replica_rank}-{os.getpid()}.jsonl"

    def opening_for(self, prompt_text: str) -> str:
        """The text to force at the start of this request's output ("" for none)."""
        after_question = prompt_text.rpartition(QUESTION_MARK)[2]
        if any(marker in after_question for marker in RESULT_MARKERS):
            every, text = self.settings.answer_every, self.settings.answer
            self.after_results += 1
            if every and text is not None and (self.after_results - 1) % every == 0:
                return f"<answer> {text} </answer>"
            return ""
        every = self.settings.search_every
        self.first_turns += 1
        if every and (self.first_turns - 1) % every == 0:
            return search_opening(prompt_text, question_of(prompt_text))
        return ""

    def observe(self, event: dict[str, Any]) -> None:
        """Append the server's event to this server's record file (when ``record_dir`` is set)."""
        if self._record_path is not None:
            with open(self._record_path, "a") as f:
                f.write(json.dumps(event) + "\n")
