"""How much a query's vector depends on its batch-mates, per encoder precision (what the batched server changes).

    python benchmarks/encoder_batch_invariance.py

The same 20 toy questions are encoded alone (one forward pass each) and inside batches of other shapes: 64 questions,
the 20 with one long text, the 20 together. Printed per precision (and with the server's default padding of every
shape, ``--encoder_shape_multiple``): the largest change of any vector component, the
rows that came out bit for bit the same, and the largest change of an inner-product score against the vectors alone
(what reorders near-tied passages). The server's batcher puts each query in a batch of whatever else is waiting.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import toy_questions  # noqa: E402

from local_dense_retriever.config import ServerConfig, default_cache_dir  # noqa: E402
from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path, cpu_bf16_flags  # noqa: E402
from local_dense_retriever.toy.corpus import generate_toy_dataset  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--questions", type=int, default=20, help="questions shown (each encoded alone and in batches)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ds = generate_toy_dataset(default_cache_dir() / "toy-100000", 100_000, seed=0)
    questions = toy_questions(ds.corpus_path)
    now = datetime.now(timezone.utc)
    print(f"# encoder batch invariance: all-MiniLM-L6-v2, {args.threads} threads, CPU flags "
          f"{'+'.join(cpu_bf16_flags()) or 'no bf16'} ({platform.machine()}), torch {torch.__version__}, "
          f"{now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    shown = questions[: args.questions]
    long_text = "the history of the river " * 12
    batches = {  # each way: the calls to encode, whose first rows, in order, are the shown questions
        "in batches of 64": [(shown + questions[len(shown) : 64])[i : i + 64] for i in range(0, len(shown), 64)],
        "beside one long text": [shown[i : i + 63] + [long_text] for i in range(0, len(shown), 63)],
        "all in one call": [shown],
    }
    padded = ServerConfig.model_fields["encoder_shape_multiple"].default  # the server's
    runs = [("float32", 1), ("bfloat16", 1), ("bfloat16", padded), ("int8", padded)]
    for dtype, multiple in runs if cpu_bf16_flags() else [r for r in runs if r[0] != "bfloat16"]:
        encoder = HFEncoder(bundled_minilm_path(), dtype=dtype, shape_multiple=multiple)
        with torch.inference_mode():
            alone = torch.cat([encoder.encode([q]) for q in shown])
            for name, batch in batches.items():
                got = torch.cat([encoder.encode(call)[: len(call) - (call[-1] == long_text)] for call in batch])
                got = got[: len(shown)]
                component = (got - alone).abs().max().item()
                same = int((got == alone).all(dim=1).sum())
                score = ((got - alone) @ alone.T).abs().max().item()
                print(f"{dtype:9} shapes x{multiple} {name:21} max component change {component:.1e}, rows "
                      f"bit-identical {same:2}/{len(shown)}, max score change {score:.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
