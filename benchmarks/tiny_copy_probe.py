"""Does the tiny policy learn to copy? A five-minute probe of what limits ``make train`` (issue 12).

SFT in a plain torch loop (no verl, no Ray: just the learning problem) on the native trajectories that
``make train``'s data stage wrote, then two measures on held-out trajectories:
- teacher-forced accuracy of the query tokens (inside ``<search>``) and answer tokens (inside ``<answer>``);
- greedy queries from the prompt alone, and how many of them are exactly the query the trajectory searched
  (the question, verbatim: a model that cannot copy the question's entity never retrieves the right passage).

    python -m verl_search.train --out runs/train    # (or any run) writes runs/train/data/sft.parquet and
                                                      # runs/train/initial_model; stop it after "initial model"
    python benchmarks/tiny_copy_probe.py --run runs/train --steps 200 [--init MODEL_DIR] [--lr 2e-3]

``--init`` starts from another model folder with the same tokenizer instead of the random initial model (for
example ``RUN/base_model``, the base-model stage of ``make train``; with ``--steps 0`` it is only evaluated);
``--pretrain`` first pre-trains the initial model on another toy world (``verl_search.train.pretrain``: repeated-span
copying, then language) into ``<run>/probe_base_model_...`` and starts from that (reused when present).
Run alone: an SFT step is ~1 s on a quiet 2-core CPU, several times that on a busy one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QUERY, ANSWER = 1, 2


def _spans(tokenizer, text: str) -> list[tuple[int, int, int]]:
    """(kind, first token, end token) of the query / answer inside one model segment, in segment tokens."""
    out = []
    for open_tag, kind in (("<search>", QUERY), ("<answer>", ANSWER)):
        if open_tag in text:
            head = text[: text.index(open_tag) + len(open_tag)]
            body_end = text.index("</" + open_tag[1:])
            first = len(tokenizer.encode(head, add_special_tokens=False))
            end = len(tokenizer.encode(text[:body_end].rstrip(), add_special_tokens=False))
            out.append((kind, first, end))
    return out


def load_rows(run: Path, tokenizer) -> list[dict]:
    """Token layout of every native SFT row, with the kind (query/answer/other) of each token."""
    import pandas as pd

    from verl_search.train.sft_dataset import native_token_layout

    frame = pd.read_parquet(run / "data" / "sft.parquet")
    rows = []
    for _, row in frame[frame.protocol == "native"].iterrows():
        prompt = [dict(m) for m in row["messages"] if m["role"] != "assistant"]
        segments = [dict(s) for s in row["segments"]]
        ids, mask = native_token_layout(tokenizer, prompt, segments)
        kinds = [0] * len(ids)
        position = mask.index(1)
        for segment in segments:
            if segment["loss"]:
                for kind, first, end in _spans(tokenizer, segment["text"]):
                    kinds[position + first : position + end] = [kind] * (end - first)
            position += len(tokenizer.encode(segment["text"], add_special_tokens=False))
        first = segments[0]["text"]
        query = first.split("<search>")[1].split("</search>")[0].strip() if "<search>" in first else ""
        rows.append({"ids": ids, "mask": mask, "kinds": kinds, "query": query})
    return rows


def _batch(rows, pad_id):
    import torch

    from verl_search.train.pretrain import padded

    ids, mask, attention = padded([(r["ids"], r["mask"]) for r in rows], pad_id)
    kinds = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        kinds[i, : len(r["kinds"])] = torch.tensor(r["kinds"])
    return ids, mask, kinds, attention


def token_accuracy(model, rows, pad_id) -> dict[str, float]:
    import torch

    hits, totals = {QUERY: 0, ANSWER: 0}, {QUERY: 0, ANSWER: 0}
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), 16):
            ids, _, kinds, attention = _batch(rows[start : start + 16], pad_id)
            predicted = model(input_ids=ids, attention_mask=attention).logits[:, :-1].argmax(-1)
            for kind in hits:
                where = kinds[:, 1:] == kind
                hits[kind] += int((predicted[where] == ids[:, 1:][where]).sum())
                totals[kind] += int(where.sum())
    model.train()
    return {"query_tokens": hits[QUERY] / max(1, totals[QUERY]), "answer_tokens": hits[ANSWER] / max(1, totals[ANSWER])}


def greedy_queries(model, tokenizer, rows, limit: int) -> list[tuple[str, str]]:
    """(true first query, the model's greedy first query) for ``limit`` rows."""
    import torch

    out = []
    for row in rows[:limit]:
        prompt = torch.tensor([row["ids"][: row["mask"].index(1)]])
        generated = model.generate(prompt, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(generated[0, prompt.shape[1] :])
        query = text.split("<search>", 1)[1].split("</search>")[0].strip() if "<search>" in text else ""
        out.append((row["query"], query))
    return out


def pretrained_base(run: Path, world_seed: int, copy_steps: int, lm_steps: int) -> Path:
    """``<run>/probe_base_model_...``: the run's initial model pre-trained on the toy world of ``world_seed``."""
    from local_dense_retriever.toy.corpus import generate_toy_dataset
    from verl_search.train.config import PretrainSettings
    from verl_search.train.initial_model import corpus_texts
    from verl_search.train.pretrain import pretrain

    out = run / f"probe_base_model_w{world_seed}_c{copy_steps}_l{lm_steps}"
    if (out / "config.json").is_file():
        return out
    world = generate_toy_dataset(run / f"probe_world_{world_seed}", num_passages=4000, seed=world_seed, num_questions=0)
    spec = PretrainSettings(copy_steps=copy_steps, lm_steps=lm_steps)
    stats = pretrain(run / "initial_model", out, corpus_texts(world.corpus_path), spec)
    print(f"pre-trained in {stats['seconds']:.0f} s: loss {stats['first_loss']:.2f} -> {stats['last_loss']:.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a make-train output folder (data/ and initial_model/)")
    p.add_argument("--init", type=Path, help="start from this model folder (default: <run>/initial_model)")
    p.add_argument("--steps", type=int, default=200, help="SFT steps (0: only evaluate the starting model)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval_every", type=int, default=100)
    p.add_argument("--held_out", type=int, default=64)
    p.add_argument("--samples", type=int, default=12, help="greedy queries to show and score at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pretrain", action="store_true", help="pre-train on another toy world first (see above)")
    p.add_argument("--pretrain_world_seed", type=int, default=1, help="seed of that world (make train's is 0)")
    p.add_argument("--pretrain_copy_steps", type=int, default=1000, help="steps of the repeated-span task")
    p.add_argument("--pretrain_lm_steps", type=int, default=600, help="steps of language modelling mixed with it")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from verl_search.train.pretrain import adamw_cosine, apply_update, masked_loss

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.run / "initial_model")
    start = args.init or args.run / "initial_model"
    if args.pretrain:
        start = pretrained_base(args.run, args.pretrain_world_seed, args.pretrain_copy_steps, args.pretrain_lm_steps)
    model = Qwen2ForCausalLM.from_pretrained(start, attn_implementation="eager")
    rows = load_rows(args.run, tokenizer)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(rows))
    held_out = [rows[i] for i in order[: args.held_out]]
    train = [rows[i] for i in order[args.held_out :]]
    optimizer, schedule = adamw_cosine(model, args.lr, args.steps, warmup_steps=10)
    params = sum(x.numel() for x in model.parameters())
    print(f"{len(train)} training / {len(held_out)} held-out trajectories; {params} parameters")
    started, queue = time.monotonic(), []
    for step in range(1, args.steps + 1):
        if len(queue) < args.batch_size:
            queue += rng.permutation(len(train)).tolist()
        ids, mask, _, attention = _batch([train[queue.pop()] for _ in range(args.batch_size)], tokenizer.pad_token_id)
        loss = masked_loss(model, ids, mask, attention)
        apply_update(loss, model, optimizer, schedule)
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = token_accuracy(model, held_out, tokenizer.pad_token_id)
            shown = ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items())
            print(
                f"step {step}: loss {loss.item():.3f}; held-out {shown}; {time.monotonic() - started:.0f} s", flush=True
            )
    if args.steps == 0:  # evaluate the starting model as it is
        accuracy = token_accuracy(model, held_out, tokenizer.pad_token_id)
        print("no SFT; held-out " + ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items()), flush=True)
    pairs = greedy_queries(model, tokenizer, held_out, args.samples)
    exact = sum(true == got for true, got in pairs)
    for true, got in pairs:
        print(f"  asked {true!r}\n  wrote {got!r}")
    print(f"greedy first queries equal to the question: {exact}/{len(pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
