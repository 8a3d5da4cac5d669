"""The float32 query encoder, eager against compiled: the lever left for CPUs without bf16 hardware (issue 29).

    python benchmarks/encoder_compiled.py [--batch 64] [--batches 20]

all-MiniLM-L6-v2 in float32 on the CPU, batches of toy questions tokenised as the server does (``BatchTokenizer``,
widths padded to multiples of 4). Three forms of the same model: eager (what the server runs), TorchScript traced
and frozen with ``optimize_for_inference`` (oneDNN fusion), and ``torch.compile`` (inductor, ``freezing`` on,
dynamic shapes), with its compile time. Queries/s, best of 3 passes over the batches, after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retriever_load import prepare, toy_questions  # noqa: E402

from local_dense_retriever.batch_tokenizer import BatchTokenizer  # noqa: E402
from local_dense_retriever.encoder import bundled_minilm_path  # noqa: E402


@torch.inference_mode()
def best_qps(forward, batches: list[dict], size: int) -> float:
    for b in batches[:3]:
        forward(b)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for b in batches:
            forward(b)
        best = min(best, time.perf_counter() - t0)
    return size * len(batches) / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = bundled_minilm_path()
    model = AutoModel.from_pretrained(str(path)).eval()
    tokenize = BatchTokenizer(AutoTokenizer.from_pretrained(str(path)), 256, 4)
    corpus, _, _, _ = prepare(2_000, "random")
    questions = toy_questions(corpus)
    need = args.batch * args.batches
    questions = (questions * (1 + need // len(questions)))[:need]
    batches = [tokenize(questions[i : i + args.batch]) for i in range(0, need, args.batch)]
    now = datetime.now(timezone.utc)
    print(f"# float32 MiniLM at batch {args.batch}, {args.threads} threads, {os.cpu_count()} CPUs "
          f"({platform.machine()}), torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip

    eager = best_qps(lambda b: model(**b).last_hidden_state, batches, args.batch)
    print(f"eager                 {eager:8.1f} q/s  1.00x", flush=True)

    with torch.inference_mode():
        b0 = batches[0]
        traced = torch.jit.trace(model, (b0["input_ids"], b0["attention_mask"], b0["token_type_ids"]), strict=False)
        frozen = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
    qps = best_qps(lambda b: frozen(b["input_ids"], b["attention_mask"], b["token_type_ids"]), batches, args.batch)
    print(f"TorchScript frozen    {qps:8.1f} q/s  {qps / eager:.2f}x", flush=True)

    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    compiled = torch.compile(model, dynamic=True)
    t0 = time.perf_counter()
    with torch.inference_mode():
        compiled(**batches[0])
    compile_s = time.perf_counter() - t0
    qps = best_qps(lambda b: compiled(**b).last_hidden_state, batches, args.batch)
    print(f"inductor (freezing)   {qps:8.1f} q/s  {qps / eager:.2f}x  (compiled in {compile_s:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
