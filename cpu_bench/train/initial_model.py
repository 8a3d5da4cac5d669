"""The untrained policy for ``make train``: a tiny random Qwen2 with a tokenizer trained on the toy corpus.

The project's local tokenizer (:mod:`cpu_bench.train.local_tokenizer`) knows chat markup but not the toy world's
made-up names, which it splits into ~1.7 characters per token; this one keeps the same chat template, special and
added tokens (so verl's Qwen2 token builder and hermes parser treat it like Qwen2.5's) and learns its merges from toy
passages, prompts and the protocol markup as well, so passages are about 3x shorter. Like a real base model's
tokenizer, it is learnt on *other* toy worlds than the evaluated one (``tokenizer_texts``): learnt on the evaluated
world, its most frequent names (the cities most questions ask for) became whole tokens that no other world uses, so
the base-model stage never trained them and a name copied there was not copied here.
Invariant: the same inputs give the same folder; the folder is complete (config, fp32 weights, tokenizer) or absent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from cpu_bench.train.config import ModelSettings
from cpu_bench.train.tiny_model import build_qwen2, save_model

logger = logging.getLogger(__name__)


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
    from cpu_bench.train.local_tokenizer import build_bpe_tokenizer

    return build_bpe_tokenizer([*texts, *_markup_lines()], vocab_size)


def corpus_texts(corpus_path: Path) -> list[str]:
    """The ``contents`` of every corpus line."""
    with open(corpus_path, encoding="utf-8") as f:
        return [json.loads(line)["contents"] for line in f if line.strip()]


def tokenizer_texts(world_seeds: Sequence[int], passages: int, templates: Sequence, cache_dir: Path) -> list[str]:
    """The passages of toy worlds ``world_seeds`` (``passages`` each, generated under ``cache_dir`` or reused) and
    every one of their questions rendered through each chat template in ``templates`` (``PromptTemplate``)."""
    from cpu_bench.train.other_worlds import world_dataset
    from cpu_bench.train.questions import all_questions
    from local_dense_retriever.toy.world import ToyWorld
    from verl_search.data.rows import shown_question

    texts: list[str] = []
    for seed in world_seeds:
        texts += corpus_texts(world_dataset(seed, passages, cache_dir).corpus_path)
        for question in all_questions(ToyWorld(passages, seed)):
            for template in templates:
                texts += [m["content"] for m in template.render(shown_question(question["question"]))]
    return texts


def write_initial_model(out: Path, texts: Iterable[str], sizes: ModelSettings) -> Path:
    """Train a ``sizes.vocab_size`` tokenizer on ``texts``, build the random model of ``sizes`` (tied embeddings),
    and save both to ``out`` (atomically)."""
    tokenizer = build_tokenizer(texts, sizes.vocab_size)
    model = build_qwen2(sizes, tokenizer, tie_embeddings=True)
    save_model(Path(out), model, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    logger.info("initial model: %d parameters, vocabulary %d", params, len(tokenizer))
    return Path(out)
