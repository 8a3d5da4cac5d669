"""The query encoder, eager against compiled: the lever left for CPUs without bf16 hardware (issue 29).

    python benchmarks/encoder_compiled.py [--batch 64] [--batches 20] [--dtype float32|bfloat16]

all-MiniLM-L6-v2 on the CPU, batches of toy questions tokenised as the server does (``BatchTokenizer``, widths padded
to multiples of 4). The model padded, in three forms: eager, TorchScript traced and frozen with
``optimize_for_inference`` (oneDNN fusion), and ``torch.compile`` (inductor, ``freezing`` on, dynamic shapes), with
its compile time. Then what the server runs, the packed encoder (``HFEncoder.encode``: real tokens only), eager and
with each layer's dense part (attention output, residual, LayerNorm, feed-forward) compiled by inductor, the attention
left eager (its scatter and gather have data-dependent shapes). Queries/s, best of 3 passes, after a warm-up.
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
from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path  # noqa: E402
from local_dense_retriever.packed_encoder import PackedEncoder  # noqa: E402


def dense_compiled(packed: PackedEncoder) -> list[tuple]:
    """``packed.layers`` with everything after each layer's attention compiled as one function (inductor, dynamic
    shapes): the slot of the attention's output module gets it, the feed-forward slots pass their input through."""
    layers = []
    for weight, bias, attention_out, intermediate, out in packed.layers:

        def dense(attended, x, attention_out=attention_out, intermediate=intermediate, out=out):
            x = attention_out(attended, x)
            return out(intermediate(x), x)

        layers.append((weight, bias, torch.compile(dense, dynamic=True), lambda y: y, lambda y, x: y))
    return layers


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
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = p.parse_args()
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = bundled_minilm_path()
    model = AutoModel.from_pretrained(str(path)).eval().to(getattr(torch, args.dtype))
    tokenize = BatchTokenizer(AutoTokenizer.from_pretrained(str(path)), 256, 4)
    corpus, _, _, _ = prepare(2_000, "random")
    questions = toy_questions(corpus)
    need = args.batch * args.batches
    questions = (questions * (1 + need // len(questions)))[:need]
    texts = [questions[i : i + args.batch] for i in range(0, need, args.batch)]
    batches = [tokenize(t) for t in texts]
    now = datetime.now(timezone.utc)
    print(f"# {args.dtype} MiniLM at batch {args.batch}, {args.threads} threads, {os.cpu_count()} CPUs "
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

    encoder = HFEncoder(path, device="cpu", dtype=args.dtype)
    packed = encoder.packed
    served = packed.layers
    packed.layers = compiled_layers = dense_compiled(packed)
    t0 = time.perf_counter()
    encoder.encode(texts[0])
    compile_s = time.perf_counter() - t0
    rounds = []
    for _ in range(2):  # alternated: the VM's pace drifts
        packed.layers = served
        rounds.append(("packed eager (served)", best_qps(encoder.encode, texts, args.batch)))
        packed.layers = compiled_layers
        rounds.append(("packed, dense compiled", best_qps(encoder.encode, texts, args.batch)))
    packed.layers = served
    for name, qps in rounds:
        print(f"{name:22}{qps:8.1f} q/s  {qps / eager:.2f}x", flush=True)
    for (_, base), (_, qps) in zip(rounds[::2], rounds[1::2], strict=True):
        print(f"dense parts compiled: {qps / base:.2f}x the packed eager encoder (compiled in {compile_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
