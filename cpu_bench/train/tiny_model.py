"""``python -m cpu_bench.train.tiny_model --out DIR``: a tiny random Qwen2 causal LM with the project's local
tokenizer, written as an HF folder verl loads by path (CPU training runs and tests; ``python -m
cpu_bench.train.tiny_model`` still works).

Invariant: the same flags and seed give the same weights; the folder is complete (config, fp32 safetensors,
tokenizer with the chat template and ``<tool_call>`` tokens) or absent, never half-written.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cpu_bench.train.config import ModelSettings

logger = logging.getLogger(__name__)


#: the sizes ``python -m cpu_bench.train.tiny_model`` writes unless told otherwise: they fit a 2-core CI machine
#: (the fields, bounds and other defaults are ``ModelSettings``'s, declared once in :mod:`cpu_bench.train.config`)
TINY_SIZES = {"layers": 2, "hidden": 64, "intermediate": 128, "max_positions": 4096}


def TinyModelSpec(**sizes) -> ModelSettings:  # noqa: N802 - the name tests and scripts call it by
    """The sizes of a tiny Qwen2: :data:`TINY_SIZES` with ``sizes`` (any ``ModelSettings`` field) on top."""
    return ModelSettings(**{**TINY_SIZES, **sizes})


def build_qwen2(spec: ModelSettings, tokenizer, *, tie_embeddings: bool):
    """A random fp32 ``Qwen2ForCausalLM`` of ``spec``'s sizes over ``tokenizer`` (seeded by ``spec.seed``; the
    vocabulary is the tokenizer's, whatever ``spec.vocab_size`` says)."""
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


def write_tiny_model(out: Path, spec: ModelSettings | None = None) -> Path:
    """Build the model with ``spec`` (default: :data:`TINY_SIZES`) and save it (with the local tokenizer) to ``out``;
    returns ``out``."""
    from cpu_bench.train.local_tokenizer import build_tokenizer

    spec = spec or TinyModelSpec()
    tokenizer = build_tokenizer()
    return save_model(out, build_qwen2(spec, tokenizer, tie_embeddings=False), tokenizer)


def main(argv: list[str] | None = None) -> int:
    defaults = TinyModelSpec()
    parser = argparse.ArgumentParser(
        prog="python -m cpu_bench.train.tiny_model", description=" ".join(__doc__.split("\n\n")[0].split())
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
    try:
        spec = TinyModelSpec(
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            seed=args.seed,
        )
        write_tiny_model(args.out, spec)
    except ValueError as e:  # pydantic's ValidationError too: it names the size and its bound
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
