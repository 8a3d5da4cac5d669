"""The CPU encoder packed (real tokens only) against padded: queries and passages, float32 and bfloat16.

    python benchmarks/packed_encoder.py [--rounds 4] [--dtypes float32 bfloat16] [--budgets 1024 2048 4096]

all-MiniLM-L6-v2 through ``HFEncoder.encode`` as the server and the index builder call it (toy questions in batches
of 64 and one at a time; toy passages, max length 256, in calls of 256), once with its packed forward
(``local_dense_retriever/packed_encoder.py``) and once with it switched off (the model's own padded forward in
length-sorted sub-batches, as before); ``--budgets`` adds packed forms with other token budgets per pass
(``PACKED_TOKENS``). The forms alternate every round; the line gives each round's texts/s and the median, and the
share of the padded batches' positions that were padding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retriever_load import prepare, toy_questions  # noqa: E402

from local_dense_retriever import encoder as encoder_module  # noqa: E402
from local_dense_retriever.encoder import CPU_SUB_BATCH, PACKED_TOKENS, HFEncoder, bundled_minilm_path  # noqa: E402


def padding_share(encoder: HFEncoder, calls: list[list[str]], rows: int) -> float:
    """Padded positions / all positions of the padded forward (sub-batches of ``rows`` length-sorted texts)."""
    real = total = 0
    for texts in calls:
        lengths = sorted(len(ids) for ids in encoder.tokenizer(texts, truncation=True, max_length=256)["input_ids"])
        for part in np.array_split(np.asarray(lengths), -(-len(lengths) // rows)):
            real += int(part.sum())
            total += len(part) * -(-int(part.max()) // 4) * 4
    return 1 - real / total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--budgets", type=int, nargs="*", default=[], help="more packed forms: tokens per pass")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus, _, _, _ = prepare(2_000, "random")
    rng = np.random.default_rng(0)
    questions = toy_questions(corpus)
    passages = [json.loads(line)["contents"] for line in corpus.open()][:768]
    workloads = {
        "queries (64 a call)": ([list(rng.choice(questions, 64)) for _ in range(30)], True),
        "queries (1 a call)": ([[q] for q in questions[:300]], True),
        "passages (256 a call)": ([passages[i : i + 256] for i in range(0, len(passages), 256)], False),
    }
    now = datetime.now(timezone.utc)
    cpu = platform.processor() or platform.machine()
    print(f"# packed vs padded encoder: all-MiniLM-L6-v2, {args.threads} threads, {os.cpu_count()} CPUs ({cpu}), "
          f"torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    for dtype in args.dtypes:
        encoder = HFEncoder(bundled_minilm_path(), device="cpu", dtype=dtype, shape_multiple=4, max_length=256)
        packed = encoder.packed
        for name, (calls, is_query) in workloads.items():
            share = padding_share(encoder, calls, CPU_SUB_BATCH[encoder.dtype])
            texts = sum(len(c) for c in calls)
            budgets = {"padded": None, "packed": PACKED_TOKENS} | {f"packed-{b}": b for b in args.budgets}
            rates: dict[str, list[float]] = {form: [] for form in budgets}
            for _ in range(args.rounds):
                for form, budget in budgets.items():
                    encoder.packed = packed if budget else None
                    encoder_module.PACKED_TOKENS = budget or PACKED_TOKENS
                    encoder.encode(calls[0], is_query=is_query)  # warm
                    t0 = time.perf_counter()
                    for c in calls:
                        encoder.encode(c, is_query=is_query)
                    rates[form].append(texts / (time.perf_counter() - t0))
            med = {form: statistics.median(r) for form, r in rates.items()}
            print(f"{dtype:9} {name:22} padding {share:5.1%}  "
                  + "  ".join(f"{form} {' '.join(f'{r:.0f}' for r in rs)} (median {med[form]:.0f})"
                              for form, rs in rates.items())
                  + f" texts/s  packed/padded {med['packed'] / med['padded']:.2f}x", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
