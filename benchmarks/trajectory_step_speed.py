"""How long one base-model trajectory step takes, in fp32 and under bf16 autocast, and where its time goes.

The base-model stage of ``make train`` (``verl_search.train.pretrain.train_on_trajectories``) is its longest; this
times the same step (``padded`` rows, ``masked_loss``, ``apply_update``) on the native SFT rows of a run folder,
alternating the two precisions so that a change in machine load shows as disagreement between repeats.

    python benchmarks/trajectory_step_speed.py --run runs/train [--steps 8] [--repeats 2] [--profile]

Needs a run folder whose data stage and base model exist (``RUN/data/sft.parquet``, ``RUN/base_model``). Run alone:
on 2 cores, another job changes the figures several-fold.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_rows(run: Path, tokenizer, count: int) -> list[tuple[list[int], list[int]]]:
    import pandas as pd

    from verl_search.train.sft_dataset import native_token_layout

    frame = pd.read_parquet(run / "data" / "sft.parquet")
    frame = frame[frame.protocol == "native"].head(count)
    rows = []
    for _, row in frame.iterrows():
        prompt = [dict(m) for m in row["messages"] if m["role"] != "assistant"]
        rows.append(native_token_layout(tokenizer, prompt, [dict(s) for s in row["segments"]]))
    return rows


def trainable(model_dir: Path, steps: int):
    """``(model, optimizer, schedule)`` as ``train_on_trajectories`` sets them up (fp32, sdpa, AdamW and cosine)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from verl_search.train.pretrain import adamw_cosine

    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    return (model, *adamw_cosine(model, 1e-3, steps, 1))


def time_steps(model_dir: Path, rows, batch: int, steps: int, bf16: bool, pad_id: int) -> float:
    """Seconds per step (mean over ``steps``, after one untimed step)."""
    import torch

    from verl_search.train.pretrain import apply_update, masked_loss, padded

    model, optimizer, schedule = trainable(model_dir, steps + 1)
    batches = [padded(rows[i * batch : (i + 1) * batch], pad_id) for i in range(steps + 1)]
    started = 0.0
    for i, tensors in enumerate(batches):
        if i == 1:
            started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = masked_loss(model, *tensors)
        apply_update(loss, model, optimizer, schedule)
    return (time.perf_counter() - started) / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a make-train run folder")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also print torch.profiler's top operators (fp32)")
    args = p.parse_args()
    from transformers import AutoTokenizer

    model_dir = args.run / "base_model"
    if not (model_dir / "config.json").is_file() or not (args.run / "data" / "sft.parquet").is_file():
        print(f"error: {args.run} has no base_model/ or data/sft.parquet; run make train there first", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = native_rows(args.run, tokenizer, args.batch * (args.steps + 1))
    if len(rows) < args.batch * (args.steps + 1):
        print(f"error: {len(rows)} native rows, fewer than {args.batch * (args.steps + 1)}", file=sys.stderr)
        return 2
    mean = sum(len(ids) for ids, _ in rows) / len(rows)
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs; {len(rows)} rows, {mean:.0f} tokens on average")
    for repeat in range(args.repeats):
        for bf16 in (False, True):
            seconds = time_steps(model_dir, rows, args.batch, args.steps, bf16, tokenizer.pad_token_id)
            print(f"repeat {repeat}  {'bf16 autocast' if bf16 else 'fp32':14s} {seconds:.3f} s/step")
    if args.profile:
        import torch

        from verl_search.train.pretrain import apply_update, masked_loss, padded

        model, optimizer, schedule = trainable(model_dir, 4)
        tensors = padded(rows[: args.batch], tokenizer.pad_token_id)
        apply_update(masked_loss(model, *tensors), model, optimizer, schedule)
        with torch.profiler.profile() as prof:
            for _ in range(3):
                apply_update(masked_loss(model, *tensors), model, optimizer, schedule)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
