"""How close the query encoder runs to this CPU's matmul peak, and so how much batching could still add.

    python benchmarks/encoder_roofline.py [--rounds 5]

The batched server's ratio over the per-request mode is bounded by how fast a batch can be encoded; on a CPU that is
the matmul throughput. This measures, in one process and per dtype (float32, and bfloat16 where the CPU has bf16
instructions):

- the CPU's matmul peak as torch reaches it: a 2048^3 matmul, best of ``--rounds``, in GFLOP/s;
- the bundled MiniLM's work per toy question, counted from its config and the questions' real token counts (the
  packed encoder runs its linear layers on real tokens only): ``2 * tokens * (4 H^2 + 2 H I)`` per layer, plus the
  attention's two matmuls over each batch's padded length;
- ``HFEncoder.encode`` at batch 64 and one question at a time (median of ``--rounds`` passes over 512 questions):
  questions/s and the GFLOP/s they amount to, as a share of the peak;
- the ceiling: questions/s if a batch ran at the full peak, and its ratio to the one-at-a-time encoder, the most any
  batching could gain over encoding each query alone in this dtype (the server's per-request mode also pays HTTP and
  a full index scan per query, so its ratio can exceed this one; the float32 engine's own limit is in
  ``retriever_load.py``'s last line);
- where a batch-64 pass's time goes (``torch.profiler``, one pass over the questions): the share in the linear
  layers' matmuls (``aten::addmm``/``aten::mm``) and the rate they run at as a share of the peak (their FLOPs counted
  on the real tokens; a packed pass rounds its rows up by at most 12.5%, so the rate is a lower bound), the share in
  attention, and the rest (GELU, layer norms, the packing's copies): what is left to gain outside the matmuls.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retriever_load import prepare, toy_questions  # noqa: E402

from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path, cpu_bf16_flags  # noqa: E402

BATCH = 64


def matmul_peak(dtype: torch.dtype, rounds: int, n: int = 2048) -> float:
    """GFLOP/s of an n^3 matmul in ``dtype``, best of ``rounds``."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)
    best = min(_timed(lambda: torch.matmul(a, b, out=out)) for _ in range(rounds))
    return 2 * n**3 / best / 1e9


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def encode_seconds(encoder: HFEncoder, *workloads: list[list[str]], rounds: int = 5) -> list[float]:
    """Per workload (a list of calls), the median seconds of ``rounds`` passes of ``encoder.encode`` over it."""
    for texts in workloads[0][:2]:
        encoder.encode(texts)
    return [
        statistics.median(_timed(lambda w=w: [encoder.encode(t) for t in w]) for _ in range(rounds)) for w in workloads
    ]


def _lengths(encoder: HFEncoder, texts: list[str]) -> list[int]:
    """Each text's token count as the encoder tokenises it."""
    return [len(ids) for ids in encoder.tokenizer(texts, truncation=True, max_length=encoder.max_length)["input_ids"]]


def _linear(config, lengths: list[int]) -> float:
    hidden, inner = config.hidden_size, config.intermediate_size
    return float(config.num_hidden_layers * 2 * sum(lengths) * (4 * hidden**2 + 2 * hidden * inner))


def linear_flops(encoder: HFEncoder, texts: list[str]) -> float:
    """The FLOPs of the linear layers alone for one call on ``texts`` (real tokens)."""
    return _linear(encoder.model.config, _lengths(encoder, texts))


def flops_per_batch(encoder: HFEncoder, texts: list[str]) -> float:
    """The encoder's matmul FLOPs for one call on ``texts``: linear layers on the real tokens, attention padded."""
    config, lengths = encoder.model.config, _lengths(encoder, texts)
    attention = 2 * 2 * len(texts) * max(lengths) ** 2 * config.hidden_size
    return _linear(config, lengths) + float(config.num_hidden_layers * attention)


#: profiler op names of the linear layers' matmuls and of the attention kernel
LINEAR_OPS = {"aten::addmm", "aten::mm"}
ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::baddbmm"}


def time_shares(encoder: HFEncoder, batches: list[list[str]]) -> tuple[float, float, float]:
    """(seconds in the linear layers' matmuls, in attention, in all ops) of one profiled pass over ``batches``: each
    op's own time on the calling thread (its wall time: intra-op threads work inside it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for texts in batches:
            encoder.encode(texts)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    linear = sum(e.self_cpu_time_total for e in events if e.key in LINEAR_OPS)
    attention = sum(e.self_cpu_time_total for e in events if e.key in ATTENTION_OPS)
    return linear / 1e6, attention / 1e6, total / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    corpus, _, _, _ = prepare(100_000, "random")
    questions = toy_questions(corpus)[:512]
    batches = [questions[i : i + BATCH] for i in range(0, len(questions), BATCH)]
    now, cpu = datetime.now(timezone.utc), platform.processor() or platform.machine()
    print(f"# encoder roofline: all-MiniLM-L6-v2, {len(questions)} toy questions, {args.threads} threads, "
          f"{os.cpu_count()} CPUs ({cpu}), torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    dtypes = ["float32"] + (["bfloat16"] if cpu_bf16_flags() else [])
    for name in dtypes:
        dtype = getattr(torch, name)
        encoder = HFEncoder(bundled_minilm_path(), device="cpu", dtype=name)
        peak = matmul_peak(dtype, args.rounds)
        batch_flops = [flops_per_batch(encoder, b) for b in batches]
        single_flops = [flops_per_batch(encoder, [q]) for q in questions[:128]]
        batched, alone = encode_seconds(encoder, batches, [[q] for q in questions[:128]], rounds=args.rounds)
        batched_qps, alone_qps = len(questions) / batched, 128 / alone
        batched_gflops, alone_gflops = sum(batch_flops) / batched / 1e9, sum(single_flops) / alone / 1e9
        per_query = sum(batch_flops) / len(questions)
        ceiling = peak * 1e9 / per_query
        print(f"{name}: matmul peak {peak:.0f} GFLOP/s; {per_query / 1e6:.0f} MFLOP a question "
              f"(mean {np.mean([len(t) for t in encoder.tokenizer(questions)['input_ids']]):.1f} tokens)")  # fmt: skip
        print(f"  batch {BATCH}: {batched_qps:.0f} q/s = {batched_gflops:.0f} GFLOP/s, {batched_gflops / peak:.0%} "
              f"of the peak")  # fmt: skip
        print(f"  one at a time: {alone_qps:.0f} q/s = {alone_gflops:.0f} GFLOP/s, {alone_gflops / peak:.0%} of "
              f"the peak")  # fmt: skip
        print(f"  ceiling at the full peak: {ceiling:.0f} q/s, {ceiling / alone_qps:.1f}x one at a time "
              f"(batch {BATCH} now: {batched_qps / alone_qps:.1f}x)")  # fmt: skip
        linear, attention, total = time_shares(encoder, batches)
        rate = sum(linear_flops(encoder, b) for b in batches) / linear / 1e9
        rest = 1 - (linear + attention) / total
        print(f"  batch {BATCH}'s time: linear-layer matmuls {linear / total:.0%} (at {rate:.0f} GFLOP/s, "
              f"{rate / peak:.0%} of the peak), attention {attention / total:.0%}, the rest {rest:.0%} (GELU, layer "
              f"norms, packing copies): without the rest, {total / (linear + attention):.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
