"""Batched token-in/token-out sampling with a transformers causal LM on the CPU (the CPU rollout server's engine).

Invariant: every returned token is the model's own sample except a request's ``forced`` prefix, with the log-prob of
the distribution it was drawn from (logits over the temperature, as verl's actor computes them); requests decoded
together get the tokens they would get alone, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SampleRequest:
    """One generate call: ``max_tokens`` new tokens at most, ``forced`` tokens first (teacher-forced, scored)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    forced: list[int] = field(default_factory=list)


@dataclass
class SampleResult:
    token_ids: list[int]
    log_probs: list[float]
    stop_reason: str  # "stop" (eos, stop token or stop string), "length", or "aborted" (``should_abort`` said so)


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


class BatchSampler:
    """Decodes a list of :class:`SampleRequest` together; not thread-safe (one batch at a time)."""

    def __init__(self, model: Any, tokenizer: Any, eos_token_ids: Sequence[int], pad_token_id: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator().manual_seed(0)

    def _choose(self, request: SampleRequest, logits: torch.Tensor, step: int) -> tuple[int, float]:
        greedy = request.temperature <= 0
        scaled = logits if greedy else logits / request.temperature
        log_probs = torch.log_softmax(scaled.float(), dim=-1)
        if step < len(request.forced):
            token = request.forced[step]
        elif greedy:
            token = int(torch.argmax(scaled))
        else:
            filtered = _filter_logits(scaled.float(), request.top_k, request.top_p)
            token = int(torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=self.generator))
        return token, float(log_probs[token])

    def _stopped(self, request: SampleRequest, tokens: list[int], step: int) -> bool:
        if step < len(request.forced) - 1:
            return False  # the forced prefix is written whole
        token = tokens[-1]
        if token in request.stop_token_ids or (not request.ignore_eos and token in self.eos_token_ids):
            return True
        if request.stop:
            tail = self.tokenizer.decode(tokens[-32:], skip_special_tokens=False)
            return any(s in tail for s in request.stop)
        return False

    @torch.no_grad()
    def generate(
        self, requests: Sequence[SampleRequest], should_abort: Callable[[], bool] | None = None
    ) -> list[SampleResult]:
        """Decode ``requests`` together (left-padded prefill, one batched forward per new token); once ``should_abort``
        answers True after a step, the unfinished ones end there as ``aborted`` with the tokens they have."""
        if not requests:
            return []
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention[i, width - len(r.prompt_ids) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        tokens: list[list[int]] = [[] for _ in requests]
        scores: list[list[float]] = [[] for _ in requests]
        reasons: list[str | None] = [None] * len(requests)
        cache = None
        step = 0
        while any(reason is None for reason in reasons):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            last = out.logits[:, -1, :]
            next_ids = torch.full((len(requests),), self.pad_token_id, dtype=torch.long)
            for i, request in enumerate(requests):
                if reasons[i] is not None:
                    continue
                token, log_prob = self._choose(request, last[i], step)
                tokens[i].append(token)
                scores[i].append(log_prob)
                next_ids[i] = token
                if self._stopped(request, tokens[i], step):
                    reasons[i] = "stop"
                elif len(tokens[i]) >= request.max_tokens:
                    reasons[i] = "length"
            step += 1
            if should_abort is not None and should_abort():
                reasons = [reason or "aborted" for reason in reasons]
                break
            input_ids = next_ids[:, None]
            attention = torch.cat([attention, torch.ones((len(requests), 1), dtype=torch.long)], dim=-1)
            positions = positions[:, -1:] + 1
        return [SampleResult(t, s, r or "length") for t, s, r in zip(tokens, scores, reasons, strict=True)]
