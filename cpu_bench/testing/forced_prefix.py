"""TEST KIT: the CPU rollout server with forced openings, so CI exercises search and reward with a random model.

A random tiny model never writes a tool call nor a right answer, so GRPO would see no search and all-zero advantages.
Named by ``engine_kwargs.hf_cpu.opening_policy`` (``{path: cpu_bench.testing.forced_prefix.ForcedOpenings,
search_every: 2, answer: Paris, answer_every: 1, record_dir: DIR}``), :class:`ForcedOpenings` serves in place of
``CpuRolloutServer``: every k-th first-turn request opens with a real search call on the prompt's question, and every
k-th request that follows a search result opens with ``<answer> TEXT </answer>``; with ``access_every``, every k-th
request that follows a search result naming a url opens with an ``access`` call of that url instead (and the answer
follows the page). Exactly those tokens are forced; they
are scored with the model's real log-probs, and everything after them is the model's own sampling. With
``record_dir`` it also appends each server event (start, weight update with the weights' fingerprint, generate call)
as a JSON line to ``DIR/server-<replica>-<pid>.jsonl``.
Invariant: nothing is forced unless a ``*_every`` setting asks for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cpu_bench.testing.scripted_policy import QUESTION_MARK, question_of, search_call
from verl_search.cpu.options import BACKEND_NAME, CpuRolloutOptions
from verl_search.cpu.rollout_server import CpuRolloutServer
from verl_search.cpu.sampler import SampleRequest
from verl_search.errors import CpuRolloutConfigError, validation_text

RESULT_MARKERS = ("</tool_response>", "</information>")
POLICY_PATH = "cpu_bench.testing.forced_prefix.ForcedOpenings"
#: the first url a search result names (the search tool's show_urls), and the header of a page the access tool shows
_URL = re.compile(r"\(URL: (\S+?)\)")
_PAGE = "[page "


def access_opening(url: str) -> str:
    """A hermes call of the ``access`` tool on ``url``."""
    return f"<tool_call>\n{json.dumps({'name': 'access', 'arguments': {'url': url}})}\n</tool_call>"


def search_opening(prompt_text: str, question: str) -> str:
    """A search call in the prompt's protocol: hermes JSON when the prompt lists tools, else Search-R1 tags."""
    return search_call(question, native="<tools>" not in prompt_text)


def weight_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes (changes whenever any weight changes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class ForcingSettings(BaseModel):
    """The keys of ``opening_policy`` beside its ``path``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    search_every: int = Field(
        0,
        ge=0,
        description="every k-th first-turn request starts with a forced, real search call on the question "
        "(hermes <tool_call> when the prompt lists tools, else <search>); 0 = never",
    )
    answer: str | None = Field(None, description="text of a forced '<answer>...</answer>' opening")
    answer_every: int = Field(0, ge=0, description="every k-th request that follows a search result starts with it")
    access_every: int = Field(
        0,
        ge=0,
        description="every k-th request that follows a search result naming a url starts with an access call of its "
        "first url (before any answer); 0 = never",
    )
    record_dir: str | None = Field(None, description="folder where each server appends a JSON line per event")

    @classmethod
    def of(cls, options: CpuRolloutOptions) -> ForcingSettings:
        """The settings in ``options.opening_policy``; a bad one is a config error naming it."""
        settings = {k: v for k, v in (options.opening_policy or {}).items() if k != "path"}
        try:
            return cls(**settings)
        except ValidationError as e:
            where = f"actor_rollout_ref.rollout.engine_kwargs.{BACKEND_NAME}.opening_policy"
            raise CpuRolloutConfigError(validation_text(e, where)) from e


class Openings:
    """Decides, per request, which opening (if any) to force; counts first turns and post-result turns apart."""

    def __init__(self, settings: ForcingSettings) -> None:
        self.settings = settings
        self.first_turns = 0
        self.after_results = 0
        self.after_urls = 0

    def opening_for(self, prompt_text: str) -> str:
        """The text to force at the start of this request's output ("" for none)."""
        after_question = prompt_text.rpartition(QUESTION_MARK)[2]
        if any(marker in after_question for marker in RESULT_MARKERS):
            latest = after_question.rpartition("<tool_response>")[2]
            url = _URL.search(latest) if _PAGE not in latest else None
            if self.settings.access_every and url is not None:
                self.after_urls += 1
                if (self.after_urls - 1) % self.settings.access_every == 0:
                    return access_opening(url.group(1))
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


class ForcedOpenings(CpuRolloutServer):
    """``CpuRolloutServer`` whose outputs open as :class:`Openings` decides, recording its events when asked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = ForcingSettings.of(self.options)
        self.openings = Openings(settings)
        self._record_path: Path | None = None
        if settings.record_dir:
            Path(settings.record_dir).mkdir(parents=True, exist_ok=True)
            self._record_path = Path(settings.record_dir) / f"server-{self.replica_rank}-{os.getpid()}.jsonl"
            self._record({"event": "start", "fingerprint": weight_fingerprint(self.model)})

    def _record(self, event: dict[str, Any]) -> None:
        """Append one event, stamped with time, replica and weight version, to this server's record file."""
        if self._record_path is None:
            return
        entry = {"time": time.time(), "replica": self.replica_rank, "global_steps": self.global_steps, **event}
        with open(self._record_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def _request(self, prompt_ids: list[int], params: dict[str, Any]) -> SampleRequest:
        request = super()._request(prompt_ids, params)
        opening = self.openings.opening_for(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if opening:
            request.forced = self.tokenizer.encode(opening, add_special_tokens=False)[: request.max_tokens]
        return request

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **kwargs: Any
    ) -> Any:
        out = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        event = {"event": "generate", "request_id": request_id, "prompt_ids": list(prompt_ids)}
        self._record({**event, "token_ids": out.token_ids, "stop_reason": out.stop_reason})
        return out

    async def update_weights(self, named_tensors: dict[str, torch.Tensor], global_steps: int | None = None) -> dict:
        reply = await super().update_weights(named_tensors, global_steps)
        if self._record_path is not None:
            fingerprint = weight_fingerprint(self.model)
            self._record({"event": "update_weights", "fingerprint": fingerprint, "seconds": reply["seconds"]})
        return reply
