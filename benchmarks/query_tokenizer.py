"""Query tokenisation: the Hugging Face wrapper against ``BatchTokenizer`` (the Rust tokenizer called directly), alone
and inside the server's encoder, on this machine.

    python benchmarks/query_tokenizer.py [--rounds 40] [--device cpu|cuda]

Toy questions with the server's settings (max length 256, token lengths padded to multiples of 4 on a CPU). For
batches of 1, 64 and 256: the best time of tokenising alone each way, and of ``HFEncoder.encode`` each way (the
encoder's ``_tokenize`` switched between the two paths, alternating every round, same process).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path  # noqa: E402
from local_dense_retriever.toy.questions import generate_questions  # noqa: E402
from local_dense_retriever.toy.world import ToyWorld  # noqa: E402

BATCHES = (1, 64, 256)


def best_ms(fn, rounds: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None, help="encoder folder (default: the bundled MiniLM)")
    args = p.parse_args()
    questions = [q["question"] for q in generate_questions(ToyWorld(2_000, seed=0), max(BATCHES))]
    # e5's prefix, as a wiki-18 server adds it; encode() adds it itself, so tokenising alone gets it here
    enc = HFEncoder(args.model or bundled_minilm_path(), retriever_name="e5", device=args.device, shape_multiple=4)
    direct = enc._tokenize.backend
    assert direct is not None, "this tokenizer has no Rust backend to call directly"

    def sync():
        if enc.device.type == "cuda":
            torch.cuda.synchronize()

    def tokenise(texts):
        prefixed = [enc.query_prefix + t for t in texts]
        return lambda: enc._tokenize(prefixed)

    def encode(texts):
        return lambda: (enc.encode(texts), sync())

    now = datetime.now(timezone.utc)
    print(f"# query tokenizer: {os.cpu_count()} CPUs, device {enc.device}, encoder {enc.dtype}, torch "
          f"{torch.__version__}, {now:%Y-%m-%d %H:%M} UTC, best of {args.rounds}")  # fmt: skip
    print(f"{'batch':>5} {'tokenise: wrapper':>18} {'direct':>8} {'ratio':>6} {'encode: wrapper':>16} {'direct':>8} "
          f"{'ratio':>6}")  # fmt: skip
    for n in BATCHES:
        texts = questions[:n]
        times: dict[tuple[str, str], float] = {}
        for _ in range(2):  # alternate the paths, keep each one's best
            for path, backend in (("wrapper", None), ("direct", direct)):
                enc._tokenize.backend = backend
                for what, make in (("tokenise", tokenise), ("encode", encode)):
                    ms = best_ms(make(texts), args.rounds // 2)
                    times[what, path] = min(ms, times.get((what, path), float("inf")))
        tw, td, ew, ed = (times[k] for k in (("tokenise", "wrapper"), ("tokenise", "direct"),
                                             ("encode", "wrapper"), ("encode", "direct")))  # fmt: skip
        print(f"{n:>5} {tw:>15.3f} ms {td:>5.3f} ms {tw / td:>5.2f}x {ew:>13.2f} ms {ed:>5.2f} ms {ew / ed:>5.2f}x")
    enc._tokenize.backend = direct
    return 0


if __name__ == "__main__":
    sys.exit(main())
