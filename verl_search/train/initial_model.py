"""The untrained policy for ``make train``: a tiny random Qwen2 with a tokenizer trained on the toy corpus.

The project's local tokenizer (:mod:`verl_search.cpu.local_tokenizer`) knows chat markup but not the toy world's
made-up names, which it splits into ~1.7 characters per token; this one keeps the same chat template, special and
added tokens (so verl's Qwen2 token builder and hermes parser treat it like Qwen2.5's) and learns its merges from the
corpus, the prompts and the protocol markup as well, so passages are about 3x shorter.
Invariant: the same inputs give the same folder; the folder is complete (config, fp32 weights, tokenizer) or absent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """Sizes of the policy and its tokenizer; the defaults train in minutes on a 2-core CPU."""

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    vocab_size: int = 4096
    max_positions: int = 2048
    seed: int = 0


def _markup_lines() -> list[str]:
    """Protocol text every trajectory uses, so its pieces become single tokens."""
    call = json.dumps({"name": "search", "arguments": {"query_list": ["q"]}})
    return [
        "<think> I need to search for this. </think>\n<search> q </search>\n",
        "<think> I need one more search. </think>\n<tool_call>\n" + call + "\n</tool_call>\n",
        "<think> I found the answer. </think>\n<answer> a </answer>\n",
        '\n\n<information>Doc 1(Title: "T") text</information>\n\n',
        '<tool_response>\nDoc 1(Title: "T") text ...(truncated)\n</tool_response>\n',
    ] * 200


def build_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer learnt on ``texts`` and the protocol markup, with the local tokenizer's chat
    template and tokens."""
    from verl_search.cpu.local_tokenizer import build_bpe_tokenizer

    return build_bpe_tokenizer([*texts, *_markup_lines()], vocab_size)


def corpus_texts(corpus_path: Path) -> list[str]:
    """The ``contents`` of every corpus line."""
    with open(corpus_path, encoding="utf-8") as f:
        return [json.loads(line)["contents"] for line in f if line.strip()]


def write_initial_model(out: Path, texts: Iterable[str], spec: ModelSpec = ModelSpec()) -> Path:
    """Train the tokenizer on ``texts``, build the random model, and save both to ``out`` (atomically)."""
    from verl_search.cpu.tiny_model import TinyModelSpec, build_qwen2, save_model

    sizes = TinyModelSpec(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.intermediate, spec.max_positions)
    tokenizer = build_tokenizer(texts, spec.vocab_size)
    model = build_qwen2(replace(sizes, seed=spec.seed), tokenizer, tie_embeddings=True)
    save_model(Path(out), model, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    logger.info("initial model: %d parameters, vocabulary %d", params, len(tokenizer))
    return Path(out)
