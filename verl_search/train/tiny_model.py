"""``python -m verl_search.train.tiny_model --out DIR``: a tiny random Qwen2 causal LM with the project's local
tokenizer, written as an HF folder verl loads by path (CPU training runs and tests; ``python -m
verl_search.cpu.tiny_model`` still works).

Invariant: the same flags and seed give the same weights; the folder is complete (config, fp32 safetensors,
tokenizer with the chat template and ``<tool_call>`` tokens) or absent, never half-written.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny Qwen2; the defaults fit a 2-core CI machine."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_positions: int = 4096
    seed: int = 0


def build_qwen2(spec: TinyModelSpec, tokenizer, *, tie_embeddings: bool):
    """A random fp32 ``Qwen2ForCausalLM`` of ``spec``'s sizes over ``tokenizer`` (seeded by ``spec.seed``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        raise ValueError(f"hidden ({spec.hidden}) must divide by heads ({spec.heads}), heads by kv_heads")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=tie_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model(out: Path, model, tokenizer) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` to ``out`` atomically; returns ``out``."""
    from verl_search.atomic import atomic_path

    out = Path(out)
    with atomic_path(out) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    return out


def write_tiny_model(out: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Build the model with ``spec`` and save it (with the local tokenizer) to ``out``; returns ``out``."""
    from verl_search.train.local_tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    return save_model(out, build_qwen2(spec, tokenizer, tie_embeddings=False), tokenizer)


def main(argv: list[str] | None = None) -> int:
    defaults = TinyModelSpec()
    parser = argparse.ArgumentParser(
        prog="python -m verl_search.train.tiny_model", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--out", required=True, type=Path, help="folder to write (must not exist)")
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    parser.add_argument("--intermediate", type=int, default=defaults.intermediate)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists", file=sys.stderr)
        return 1
    spec = TinyModelSpec(args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate, seed=args.seed)
    try:
        write_tiny_model(args.out, spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
