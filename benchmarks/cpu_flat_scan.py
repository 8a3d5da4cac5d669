"""The flat scan of a query batch on the CPU: its matmul in float32, bfloat16 and int8, and the search with a coarse
pre-scan (bf16 or int8).

    python benchmarks/cpu_flat_scan.py [--rows 100000] [--dim 384] [--batch 64] [--k 3]
    python benchmarks/cpu_flat_scan.py --search [--vectors minilm] [--rounds 5] [--rows 2000000]

Without ``--search``: seeded random unit vectors (the matmul's cost does not depend on their values); each figure is
the mean of 20 calls after a warm-up: ``matmul`` writes the (batch, rows) scores into one kept buffer as
``TorchFlatIndex`` does; ``topk`` is ``torch.topk`` over those scores; ``int8`` is ``torch._int_mm`` (int32 sums).
``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` (or ``AVX512_CORE_VNNI``, ``AVX2``) holds oneDNN, which runs the bf16 and
int8 matmuls, to an older CPU's instructions: a CPU with AVX512-BF16 but no AMX (or neither).

``--search``: ``TorchFlatIndex.search`` over ``--rows`` random unit vectors with ``--questions`` random unit
questions, or with ``--vectors minilm`` over the cached MiniLM index of the 100k-passage toy corpus
(``retriever_load.py`` says how it is built) with the toy questions encoded by the bundled MiniLM in float32, whose
scores crowd as a real encoder's do. It is timed every way, alternated ``--rounds`` times (median ms per batch of
``--batch`` questions): ``--index_prefilter off`` (the float32 scan) and each of ``--prefilters`` (``bfloat16``,
``int8``: the pre-scan, float32 re-scoring, more rows gathered for crowded queries). Also, per pre-scan: how many rows
lie within its margin of each question's k-th score (what it must keep), how many questions were crowded, and
whether every answer equals the float32 scan's. ``--shared`` makes random vectors crowd, as an encoder whose cosines
sit high (e5's) does. ``--int8_groups 32 64`` times the int8 pre-scan with each number of groups kept per block.
"""

from __future__ import annotations

import argparse
import contextlib
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

from local_dense_retriever.index.prefilter import EXTRA_ROWS, Int8Copy, score_bounds  # noqa: E402
from local_dense_retriever.index.torch_flat import TorchFlatIndex  # noqa: E402


def mean_ms(call, repeats: int = 20) -> float:
    call()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - t0) / repeats * 1e3


def raw_matmuls(args: argparse.Namespace) -> None:
    gen = torch.Generator().manual_seed(0)
    index = torch.nn.functional.normalize(torch.randn(args.rows, args.dim, generator=gen), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(args.batch, args.dim, generator=gen), dim=-1)
    scores = torch.empty(args.batch, args.rows)
    fp32 = mean_ms(lambda: torch.matmul(queries, index.T, out=scores))
    topk = mean_ms(lambda: torch.topk(scores, args.k, dim=1))
    index_bf16, queries_bf16 = index.bfloat16(), queries.bfloat16()
    scores_bf16 = torch.empty(args.batch, args.rows, dtype=torch.bfloat16)
    bf16 = mean_ms(lambda: torch.matmul(queries_bf16, index_bf16.T, out=scores_bf16))
    topk_pre = mean_ms(lambda: torch.topk(scores_bf16, args.k + EXTRA_ROWS, dim=1))
    # int8 with int32 sums (oneDNN's s8 gemm; VNNI or AMX-INT8 where the CPU has them): what an int8 pre-scan would cost
    index_i8 = torch.randint(-127, 128, (args.rows, args.dim), generator=gen, dtype=torch.int8)
    queries_i8 = torch.randint(-127, 128, (args.batch, args.dim), generator=gen, dtype=torch.int8)
    int8 = mean_ms(lambda: torch._int_mm(queries_i8, index_i8.T))
    print(f"matmul float32 {fp32:.1f} ms, bfloat16 {bf16:.1f} ms ({fp32 / bf16:.2f}x), int8 {int8:.1f} ms "
          f"({fp32 / int8:.2f}x); top-{args.k} of float32 {topk:.1f} ms; top-{args.k + EXTRA_ROWS} of bf16 "
          f"{topk_pre:.1f} ms")  # fmt: skip


@contextlib.contextmanager
def int8_groups(count: int | None):
    """The int8 pre-scan keeps ``count`` groups per block beyond k while inside (None: its default)."""
    default = Int8Copy.extra_groups
    Int8Copy.extra_groups = default if count is None else count
    try:
        yield
    finally:
        Int8Copy.extra_groups = default


def search_both_ways(args: argparse.Namespace) -> None:
    if args.vectors == "minilm":
        from retriever_load import prepare, toy_questions

        from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path

        corpus, npy, _, kind = prepare(100_000, "minilm")
        vectors = np.load(npy, mmap_mode="r")
        questions = toy_questions(corpus)[: args.questions]
        encoder = HFEncoder(bundled_minilm_path(), device="cpu", dtype="float32")
        queries = torch.cat([encoder.encode(questions[i : i + 64]) for i in range(0, len(questions), 64)])
    else:
        gen, kind = torch.Generator().manual_seed(0), "random unit"
        shared = torch.nn.functional.normalize(torch.randn(args.dim, generator=gen), dim=0) * args.shared
        if args.shared:
            kind = f"random unit (shared direction {args.shared:g}: mean cosine {args.shared**2:.2f})"

        def unit(n: int) -> torch.Tensor:
            noise = torch.nn.functional.normalize(torch.randn(n, args.dim, generator=gen), dim=-1)
            return torch.nn.functional.normalize(shared + noise * (1 - args.shared**2) ** 0.5, dim=-1)

        vectors, queries = unit(args.rows).numpy(), unit(args.questions)
    batches = [queries[i : i + args.batch] for i in range(0, len(queries) - args.batch + 1, args.batch)]
    plain = TorchFlatIndex(vectors, device=torch.device("cpu"), prefilter="off")
    # one contender per copy; with --int8_groups, one int8 contender per number of groups kept per block
    groups = {name: None for name in args.prefilters if name != "int8" or not args.int8_groups}
    if "int8" in args.prefilters and args.int8_groups:
        groups.update({f"int8/{g}": g for g in args.int8_groups})
    pres = {name: TorchFlatIndex(vectors, device=torch.device("cpu"), prefilter=name.split("/")[0]) for name in groups}
    print(f"# {len(vectors):,} x {vectors.shape[1]} {kind} vectors, {len(queries)} questions in batches of "
          f"{args.batch}, top-{args.k}")  # fmt: skip

    scores = torch.cat([q @ torch.from_numpy(np.asarray(vectors)).T for q in queries.split(256)])
    kth = torch.topk(scores, args.k, dim=1).values[:, -1]
    for name, pre in pres.items():
        margin = (2 * score_bounds(queries, pre.coarse_copy)).float()
        within = (scores >= (kth - margin)[:, None]).sum(dim=1).float()
        q = torch.quantile(within, torch.tensor([0.5, 0.9, 0.99, 1.0])).tolist()
        print(f"{name}: rows within the margin ({margin.median():.4f}) of the k-th score: median {q[0]:.0f}, p90 "
              f"{q[1]:.0f}, p99 {q[2]:.0f}, max {q[3]:.0f} (kept per block: {args.k + EXTRA_ROWS})")  # fmt: skip

    contenders = {"float32 scan": plain, **{f"{name} pre-scan": pre for name, pre in pres.items()}}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    answers: dict[str, list[np.ndarray]] = {}
    for _ in range(args.rounds):
        for name, index in contenders.items():
            with int8_groups(groups.get(name.removesuffix(" pre-scan"))):
                t0 = time.perf_counter()
                ids = [index.search(b, args.k)[1] for b in batches]
                times[name].append((time.perf_counter() - t0) / len(batches) * 1e3)
            answers.setdefault(name, ids)
    expected = answers["float32 scan"]
    same = {name: all(np.array_equal(e, a) for e, a in zip(expected, answers[f"{name} pre-scan"], strict=True))
            for name in pres}  # fmt: skip
    base = statistics.median(times["float32 scan"])
    for name, ms in times.items():
        m = statistics.median(ms)
        print(f"{name:16s} {m:6.1f} ms a batch (rounds {', '.join(f'{x:.1f}' for x in ms)})  {base / m:.2f}x")
    for name, pre in pres.items():
        crowded = pre.crowded_queries / (args.rounds * len(batches) * args.batch)
        print(f"{name}: same ids as the float32 scan: {same[name]}; crowded questions {crowded:.1%}, (question, "
              f"block) pairs {pre.crowded_block_share:.1%}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--search", action="store_true", help="TorchFlatIndex.search with and without the pre-scans")
    p.add_argument("--vectors", choices=["random", "minilm"], default="random", help="for --search")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--questions", type=int, default=2048)
    p.add_argument(
        "--shared",
        type=float,
        default=0.0,
        help="random vectors: weight of one direction all share (0.87: mean cosine 0.76, scores crowded as e5's are)",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--prefilters", nargs="+", choices=["bfloat16", "int8"], default=["bfloat16", "int8"], help="for --search"
    )
    p.add_argument(
        "--int8_groups",
        type=int,
        nargs="+",
        help="for --search: time the int8 pre-scan keeping each of these numbers of groups per block beyond k",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    now, cpu = datetime.now(timezone.utc), platform.processor() or platform.machine()
    print(f"# flat scan: batch {args.batch}, {args.threads} threads, {os.cpu_count()} CPUs ({cpu}), "
          f"torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    if args.search:
        search_both_ways(args)
    else:
        print(f"# {args.rows:,} x {args.dim} random unit vectors")
        raw_matmuls(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
