"""Rollout tokens/s on the CPU: verl_search's hf_cpu sampler against vLLM's CPU build, same model, same prompts,
same number of tokens (``ignore_eos``), one process, engines alternated.

    .venv-vllm/bin/python benchmarks/rollout_engines.py --model .cache/demo/sft/model \\
        --prompts .cache/demo/data/rl/test.parquet --batch 64 --tokens 128 --rounds 3

What verl's per-step ``timing_s/gen`` cannot show here (it moves in 2-second steps on the CPU trainer): the engines'
own decoding rate. Prompts are the preprocessed RL rows through the model's chat template, sampled at temperature
0.7 (make train's); vLLM runs in eager mode with fp32 weights as the CPU trainer configures it. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def prompts(parquet: Path, tokenizer, count: int) -> list[list[int]]:
    import pandas as pd

    rows = pd.read_parquet(parquet).head(count)
    texts = [tokenizer.apply_chat_template(list(r), add_generation_prompt=True, tokenize=False) for r in rows["prompt"]]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def hf_cpu_rate(model_path: Path, batch: list[list[int]], tokens: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_search.cpu.sampler import BatchSampler, SampleRequest

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    sampler = BatchSampler(model, tokenizer, [tokenizer.eos_token_id], tokenizer.pad_token_id or 0)
    requests = [SampleRequest(ids, tokens, temperature=0.7, ignore_eos=True) for ids in batch]
    started = time.perf_counter()
    results = sampler.generate(requests)
    seconds = time.perf_counter() - started
    return sum(len(r.token_ids) for r in results) / seconds


def vllm_engine(model_path: Path):
    from vllm import LLM

    return LLM(
        str(model_path),
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
        max_model_len=2048,
        seed=0,
    )


def vllm_rate(llm, batch: list[list[int]], tokens: int) -> float:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.7, max_tokens=tokens, ignore_eos=True, seed=0)
    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--prompts", type=Path, required=True, help="a preprocessed parquet (its prompt column)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from transformers import AutoTokenizer

    batch = prompts(args.prompts, AutoTokenizer.from_pretrained(args.model), args.batch)
    started = time.perf_counter()
    llm = vllm_engine(args.model)
    vllm_start = time.perf_counter() - started
    vllm_rate(llm, batch[:4], 8)  # warm-up
    rates: dict[str, list[float]] = {"hf_cpu": [], "vllm": []}
    for _ in range(args.rounds):
        rates["hf_cpu"].append(round(hf_cpu_rate(args.model, batch, args.tokens)))
        rates["vllm"].append(round(vllm_rate(llm, batch, args.tokens)))
    best = {k: max(v) for k, v in rates.items()}
    print(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "batch": len(batch),
                "tokens": args.tokens,
                "prompt_tokens_mean": round(sum(map(len, batch)) / len(batch), 1),
                "tokens_per_s": rates,
                "vllm_over_hf_cpu": round(best["vllm"] / best["hf_cpu"], 2),
                "vllm_start_s": round(vllm_start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
