"""Language-model pre-training of the tiny policy on the text of *another* toy world (a different seed).

A random 1.5M-parameter model does not learn to copy a name it has never seen from its prompt into a query, nor from a
passage into an answer, in the few hundred SFT updates a CPU affords: it memorises names from the SFT set instead
(docs/results/training.md, findings). Copying needs induction heads, which plain text forms only after far more tokens
than that. So pre-training has two parts: a repeated-span task (a window of the other world's text in which a random run
of vocabulary pieces occurs twice; only the second occurrence is scored, so copying is the only way to lower the loss),
then next-token training on the other world's passages mixed with some of the same task (the names of both worlds are
made of the same syllable pieces). ``train_on_trajectories`` then trains on search trajectories of other worlds
(``cpu_bench.train.other_worlds``), which the copy skill alone does not yet turn into copying names into queries and
years into answers. The model learns no fact of the world it is asked about: it plays the part of a real base model's
pre-training. ``make train`` runs both as its base-model stage (``cpu_bench.train.base_model``).
Invariant: the pre-trained model is written to its own folder atomically (complete or absent); the same inputs and
seed give the same weights.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cpu_bench.train.config import PretrainSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchShapes:
    """The shapes of the pre-training batches: part of the recipe, not settings (the steps, worlds and learning rate
    are ``PretrainSettings``, declared once in :mod:`cpu_bench.train.config`)."""

    copy_batch_size: int = 32
    copy_seq_len: int = 48
    copy_span: tuple[int, int] = (4, 10)  # length of the repeated run, [low, high)
    lm_copy_share: float = 0.3  # share of repeated-span batches during the language phase (keeps the skill)
    batch_size: int = 16
    seq_len: int = 192
    task_batch_size: int = 8  # trajectories per step of the last phase
    warmup_steps: int = 20  # of each phase's own warm-up and cosine
    seed: int = 0


def token_stream(tokenizer, texts: Sequence[str]):
    """Every text encoded and joined, each followed by the end-of-text token, as one 1-D tensor."""
    import torch

    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text, add_special_tokens=False)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def adamw_cosine(model, lr: float, steps: int, warmup_steps: int):
    """``(optimizer, scheduler)``: AdamW (betas 0.9/0.95, no weight decay) at ``lr`` after a linear warm-up of
    ``warmup_steps``, decayed to zero by a cosine over ``steps``."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / max(1, warmup_steps))
        return warm * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(1, steps)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def apply_update(loss, model, optimizer, scheduler) -> None:
    """One optimiser step on ``loss``, gradients clipped to norm 1."""
    import torch

    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()


def repeated_span_batch(stream, pieces, shapes: BatchShapes, rng):
    """``(input_ids, labels)``: windows of ``stream`` in which a random run of ``pieces`` occurs twice; labels score
    only the second occurrence after its first piece (-100 elsewhere)."""
    import torch

    size, length = shapes.copy_batch_size, shapes.copy_seq_len
    low, high = shapes.copy_span
    ids = torch.empty(size, length, dtype=torch.long)
    labels = torch.full((size, length), -100, dtype=torch.long)
    for row in range(size):
        n = int(rng.integers(low, high))
        gap = int(rng.integers(1, length - 2 * n))
        first = int(rng.integers(0, length - 2 * n - gap + 1))
        start = int(rng.integers(0, len(stream) - length))
        ids[row] = stream[start : start + length]
        run = pieces[torch.from_numpy(rng.integers(0, len(pieces), n))]
        second = first + n + gap
        ids[row, first : first + n] = run
        ids[row, second : second + n] = run
        labels[row, second + 1 : second + n] = run[1:]
    return ids, labels


def padded(rows: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """``(input_ids, loss_mask, attention_mask)`` of ``(ids, loss mask)`` rows, padded on the right."""
    import torch

    length = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), length)
    attention = torch.zeros(len(rows), length, dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        loss_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.float)
        attention[i, : len(ids)] = 1
    return input_ids, loss_mask, attention


def masked_loss(model, input_ids, loss_mask, attention):
    """Mean next-token cross-entropy over the tokens whose loss mask is 1.

    The output layer runs only at the positions that predict a trained token: with a 4k vocabulary and a hidden size
    of 128 it costs more than the whole transformer body, and a trajectory trains on ~15% of its tokens."""
    import torch

    hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state[:, :-1]
    scored = loss_mask[:, 1:] > 0
    logits = model.lm_head(hidden[scored])
    losses = torch.nn.functional.cross_entropy(logits, input_ids[:, 1:][scored], reduction="none")
    return losses.sum() / scored.sum().clamp(min=1)


def train_loop(
    model_dir: Path,
    out: Path,
    tokenizer,
    next_batch,
    *,
    steps: int,
    lr: float,
    warmup_steps: int,
    seed: int,
    label: str,
) -> list[float]:
    """The one training loop: load the model in ``model_dir``, take ``steps`` AdamW steps (see :func:`adamw_cosine`)
    on the masked loss of ``next_batch(step, rng) -> (input_ids, loss_mask, attention_mask)``, save the model and
    ``tokenizer`` to ``out``; return every step's loss. ``seed`` seeds torch (the model) and ``rng`` (the batches)."""
    import numpy as np
    import torch
    from transformers import Qwen2ForCausalLM

    from cpu_bench.train.tiny_model import save_model

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    optimizer, lr_schedule = adamw_cosine(model, lr, steps, warmup_steps)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    for step in range(steps):
        loss = masked_loss(model, *next_batch(step, rng))
        apply_update(loss, model, optimizer, lr_schedule)
        losses.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == steps:
            logger.info("%s step %d/%d: loss %.3f", label, step + 1, steps, losses[-1])
    save_model(Path(out), model, tokenizer)
    return losses


def train_on_trajectories(
    model_dir: Path,
    out: Path,
    rows: Sequence[tuple[list[int], list[int]]],
    settings: PretrainSettings = PretrainSettings(),
    shapes: BatchShapes = BatchShapes(),
) -> dict:
    """Train the model in ``model_dir`` on tokenised trajectories ``(ids, loss mask)`` for ``settings.task_steps``
    steps (its own warm-up and cosine, like a fine-tuning run) and save it to ``out``.

    Returns ``{"seconds", "first_loss", "last_loss", "rows"}``; raises ValueError for no rows or no trained token.
    """
    from transformers import AutoTokenizer

    if not rows or not any(any(mask) for _, mask in rows):
        raise ValueError("no trajectory with a trained token to pre-train on")
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    order: list[int] = []

    def next_batch(step: int, rng):
        nonlocal order
        if len(order) < shapes.task_batch_size:
            order += rng.permutation(len(rows)).tolist()
        return padded([rows[order.pop()] for _ in range(shapes.task_batch_size)], tokenizer.pad_token_id)

    schedule = {"steps": settings.task_steps, "lr": settings.lr, "warmup_steps": shapes.warmup_steps}
    schedule["seed"] = shapes.seed
    losses = train_loop(model_dir, out, tokenizer, next_batch, **schedule, label="trajectory pre-training")
    return {"seconds": time.monotonic() - started, "first_loss": losses[0], "last_loss": losses[-1], "rows": len(rows)}


def pretrain(
    model_dir: Path,
    out: Path,
    texts: Sequence[str],
    settings: PretrainSettings = PretrainSettings(),
    shapes: BatchShapes = BatchShapes(),
) -> dict:
    """Train the model in ``model_dir`` on ``texts`` (``settings.copy_steps`` of the repeated-span task, then
    ``settings.lm_steps`` on random windows of ``seq_len`` tokens) and save it to ``out``.

    Returns ``{"seconds", "first_loss", "last_loss", "tokens"}``; raises ValueError when the texts are shorter than
    one window.
    """
    import torch
    from transformers import AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stream = token_stream(tokenizer, texts)
    if len(stream) <= max(shapes.seq_len, shapes.copy_seq_len) + 1:
        raise ValueError(f"pre-training text has {len(stream)} tokens, fewer than one window of {shapes.seq_len}")
    if settings.copy_steps and shapes.copy_seq_len < 2 * shapes.copy_span[1] + 1:
        raise ValueError(f"copy_seq_len {shapes.copy_seq_len} cannot hold two runs of {shapes.copy_span[1]} pieces")
    pieces = torch.unique(stream)

    def next_batch(step: int, rng):
        if step < settings.copy_steps or rng.random() < shapes.lm_copy_share:
            batch, labels = repeated_span_batch(stream, pieces, shapes, rng)
            scored = (labels != -100).float()
        else:
            starts = rng.integers(0, len(stream) - shapes.seq_len, shapes.batch_size)
            batch = torch.stack([stream[s : s + shapes.seq_len] for s in starts])
            scored = torch.ones(batch.shape)
        return batch, scored, torch.ones_like(batch)

    steps = settings.copy_steps + settings.lm_steps
    schedule = {"steps": steps, "lr": settings.lr, "warmup_steps": shapes.warmup_steps, "seed": shapes.seed}
    losses = train_loop(model_dir, out, tokenizer, next_batch, **schedule, label="pre-training")
    seconds = time.monotonic() - started
    return {"seconds": seconds, "first_loss": losses[0], "last_loss": losses[-1], "tokens": int(len(stream))}
