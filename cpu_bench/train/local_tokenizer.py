"""A small Qwen2.5-style tokenizer trained locally (no hub access), cached on disk so a process builds it once.

CPU harness only: it lets verl's real agent loops tokenise chat-templated prompts, hermes tool calls and tool
responses exactly as they would with Qwen2.5, without downloading a model. Invariant: the saved directory is
complete (tokenizer files + a tiny ``config.json`` with ``model_type: qwen2``) or absent, never half-written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config

from local_dense_retriever.config import default_cache_dir

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5 declares these as added, non-special tokens: they survive ``skip_special_tokens=True``.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Renders like Qwen2.5-Instruct's template: tools in the system turn, tool calls as hermes JSON blocks,
# consecutive tool messages grouped into one user turn of <tool_response> blocks.
_NL = '{{ "\\n" }}'  # a newline right after a block tag would be eaten by the template engine's trim_blocks
CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}"
    + DEFAULT_SYSTEM
    + "{% endif %}"
    + _NL
    + "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}"
    + _NL
    + "{{ tool | tojson }}{% endfor %}"
    + _NL
    + "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% else %}<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant{% if message.content %}" + _NL + "{{ message.content }}{% endif %}"
    "{% for tool_call in message.tool_calls %}"
    "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
    + _NL
    + '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{% if tool_call.arguments is string %}{{ tool_call.arguments }}"
    "{% else %}{{ tool_call.arguments | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    + _NL
    + "<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VOCAB_SIZE = 2048
_LAYOUT = "qwen2-config-v2"  # bump when the saved directory's contents change
_WORDS = (
    "search answer information think query question title doc the a of in is was who what when where which "
    "capital city country river film song album born died president wrote written directed released year team "
    "name function arguments query_list tool call response failed unknown paris france london berlin rome "
    "previous action invalid if want to i should put between and give final let me try again documents"
).split()


def _training_text(seed: int = 0, lines: int = 1200) -> list[str]:
    """Synthetic text covering chat markup, JSON and Search-R1 tags, so common pieces become single tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        out.append(words.capitalize() + rng.choice([".", "?", "!", ":", ","]) + "\n")
        out.append(f"<search> {words} </search>\n<answer> {rng.choice(_WORDS)} </answer>\n")
        out.append(f'{{"name": "search", "arguments": {{"query_list": ["{words}"]}}}}\n')
        out.append(f'Doc {rng.randint(1, 9)}(Title: "{words.title()}") {words} {rng.randint(0, 2025)}\n\n')
        out.append("<information>" + words + "</information>\n\n<think> " + words + " </think>\n")
    return out


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer learnt from ``texts`` with Qwen2.5's chat markup, special and added tokens."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The project's local tokenizer (the built-in training text, VOCAB_SIZE pieces); takes about a second."""
    return build_bpe_tokenizer(_training_text(), VOCAB_SIZE)


def _fingerprint() -> str:
    blob = "|".join([_LAYOUT, CHAT_TEMPLATE, str(VOCAB_SIZE), *SPECIAL_TOKENS, *ADDED_TOKENS, *_WORDS])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_tokenizer_dir(cache_dir: Path | None = None) -> Path:
    """Return a directory loadable as an HF model path (tokenizer + tiny qwen2 ``config.json``), building it once."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"scripted-qwen2-tokenizer-{_fingerprint()}"
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        tokenizer = build_tokenizer()
        tokenizer.save_pretrained(staging)
        # Loading configs, not weights: verl's HFModelConfig reads model_type to pick the Qwen token builder.
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            architectures=["Qwen2ForCausalLM"],
        ).save_pretrained(staging)
        try:
            os.replace(staging, target)
        except OSError:  # another process won the race; its copy is equivalent
            logger.debug("tokenizer dir %s already built concurrently", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_tokenizer(cache_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """Load the cached local tokenizer (building it on first use)."""
    return PreTrainedTokenizerFast.from_pretrained(ensure_tokenizer_dir(cache_dir))
