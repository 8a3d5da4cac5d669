"""float32, bf16 and int8 matmuls at the retriever's shapes on this CPU, and whether oneDNN runs the int8 ones.

    python benchmarks/matmul_precisions.py [--threads 2] [--rounds 7]

The shapes: MiniLM's linear layers for a 64-question batch of packed tokens (960 x 384 by 384 x 384, 384 x 1536,
1536 x 384), the same for one question (16 tokens), and a flat scan of a 64-query batch over 100,000 rows (64 x 384
by 384 x 100,000). int8 is ``torch._int_mm`` (int32 sums), bf16 ``torch.mm`` of bf16 tensors. Each: best of
``--rounds`` calls, the three precisions taking turns. Then :func:`cpu_features.matmul_slowdown` (the server's start-up
check, at its own small shape), and whether oneDNN created a primitive for an int8 matmul (``ONEDNN_VERBOSE=1`` in a
child process): on CPUs without AVX512-VNNI torch runs its own loop instead.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from local_dense_retriever.cpu_features import best_seconds, cpu_flags, matmul_slowdown  # noqa: E402
from local_dense_retriever.precision_cache import cpu_model  # noqa: E402

SHAPES = {
    "qkv/out, 64 questions": (960, 384, 384),
    "ffn up, 64 questions": (960, 384, 1536),
    "ffn down, 64 questions": (960, 1536, 384),
    "ffn up, 1 question": (16, 384, 1536),
    "flat scan, 64 queries x 100k": (64, 384, 100_000),
}
ONEDNN_PROBE = "import torch; a = torch.ones(32, 64, dtype=torch.int8); torch._int_mm(a, a.t().contiguous())"


def operands(m: int, k: int, n: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    return {
        "float32": (a, b),
        "bfloat16": (a.bfloat16(), b.bfloat16()),
        "int8": ((a * 30).round().clamp(-127, 127).to(torch.int8), (b * 30).round().clamp(-127, 127).to(torch.int8)),
    }


def best_ms(shape: tuple[int, int, int], rounds: int) -> dict[str, float]:
    calls = {"float32": torch.mm, "bfloat16": torch.mm, "int8": torch._int_mm}
    runs = {name: functools.partial(calls[name], a, b) for name, (a, b) in operands(*shape).items()}
    return {name: seconds * 1e3 for name, seconds in best_seconds(runs, repeats=rounds).items()}


def onednn_runs_int8() -> bool:
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", ONEDNN_PROBE], capture_output=True, text=True, env=env, check=True)
    return "onednn_verbose" in out.stdout + out.stderr and ",exec," in out.stdout + out.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    interesting = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile"})
    print(
        f"# {cpu_model()} ({'+'.join(interesting) or platform.machine()}), torch {torch.__version__}, "
        f"{args.threads} threads, VNNI to torch: {torch.cpu._is_vnni_supported()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    columns = ("float32 ms", "bf16 ms", "int8 ms", "bf16/f32", "int8/f32")
    print(f"{'shape':32} {'m x k x n':>18} " + " ".join(f"{c:>{max(9, len(c))}}" for c in columns))
    for label, shape in SHAPES.items():
        ms = best_ms(shape, args.rounds)
        dims = "x".join(map(str, shape))
        print(
            f"{label:32} {dims:>18} {ms['float32']:11.3f} {ms['bfloat16']:9.3f} {ms['int8']:9.3f} "
            f"{ms['bfloat16'] / ms['float32']:8.1f}x {ms['int8'] / ms['float32']:8.1f}x"
        )
    print(
        f"# start-up check (cpu_features.matmul_slowdown): int8 {matmul_slowdown('int8'):.1f}x float32's time, "
        f"bfloat16 {matmul_slowdown('bfloat16'):.1f}x; oneDNN runs torch._int_mm here: {onednn_runs_int8()}"
    )


if __name__ == "__main__":
    main()
