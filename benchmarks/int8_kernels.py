"""The int8 encoder's feed-forward block, run four ways, and what a compiled kernel's GIL costs another thread.

    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI python benchmarks/int8_kernels.py [--rows 960] [--threads 2]

MiniLM's shapes (hidden 384, inner 1,536; ``--rows`` packed tokens: 960 is a 64-question batch), random weights:

- ``float32``: ``Linear``, GELU, ``Linear``, residual, LayerNorm, eagerly (what the float32 encoder runs);
- ``int8 eager``: the int8 layers' functions (``local_dense_retriever.int8_linear``) uncompiled;
- ``int8 one graph``: the whole block compiled as one function;
- ``int8 served``: the two halves compiled apart (``gelu_up``, ``self_output``), as the server runs them.

Each: best of 9 rounds of 30 calls, the four alternated within each round. Then, in two child processes (the patch
is process-wide), how fast a pure Python loop runs beside a thread calling a compiled elementwise kernel, over the
loop alone: with inductor's binding as torch ships it, and with ``release_gil_in_compiled_kernels``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever import int8_linear  # noqa: E402

HIDDEN, INNER = 384, 1536


def best_ms(ways: dict, rounds: int = 9, calls: int = 30) -> dict[str, float]:
    """Best ms per call of each way over ``rounds`` rounds of ``calls`` calls, the ways alternated within a round."""
    best = dict.fromkeys(ways, float("inf"))
    for call in ways.values():
        for _ in range(5):
            call()
    for _ in range(rounds):
        for name, call in ways.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e3)
    return best


def whole_block(x, up_t, up_scale, up_bias, down_t, down_scale, down_bias, norm_weight, norm_bias, eps: float):
    inner = F.gelu(int8_linear.w8a8_linear(x, up_t, up_scale, up_bias))
    out = int8_linear.w8a8_linear(inner, down_t, down_scale, down_bias) + x
    return F.layer_norm(out, out.shape[-1:], norm_weight, norm_bias, eps)


def block_timings(rows: int) -> None:
    torch.manual_seed(0)
    up, down, norm = torch.nn.Linear(HIDDEN, INNER), torch.nn.Linear(INNER, HIDDEN), torch.nn.LayerNorm(HIDDEN)
    x = torch.randn(rows, HIDDEN)
    q_up, q_down = int8_linear.Int8Linear(up, compiled=False), int8_linear.Int8Linear(down, compiled=False)
    norm_args = (norm.weight, norm.bias, norm.eps)
    served_up, served_down = (
        int8_linear.compile_once(int8_linear.gelu_up),
        int8_linear.compile_once(int8_linear.self_output),
    )
    one_graph = torch.compile(whole_block, dynamic=True)
    ways = {
        "float32": lambda: norm(down(F.gelu(up(x))) + x),
        "int8 eager": lambda: int8_linear.self_output(
            int8_linear.gelu_up(x, "none", *q_up.args()), x, *norm_args, *q_down.args()
        ),
        "int8 one graph": lambda: one_graph(x, *q_up.args()[:3], *q_down.args()[:3], *norm_args),
        "int8 served": lambda: served_down(served_up(x, "none", *q_up.args()), x, *norm_args, *q_down.args()),
    }
    with torch.inference_mode():
        best = best_ms(ways)
    for name, ms in best.items():
        print(f"{name:15} {ms:6.2f} ms  {best['float32'] / ms:5.2f}x float32")


def _elementwise(x: torch.Tensor) -> torch.Tensor:
    return (x.erf() * x.sin()).exp().sqrt()


def gil_ratio(patched: bool) -> float:
    """A Python loop's speed beside a thread calling a compiled kernel, over its speed alone."""
    if not patched:
        int8_linear.release_gil_in_compiled_kernels = lambda: False  # compile_once then leaves torch's binding
    kernel, x = int8_linear.compile_once(_elementwise), torch.rand(8_000_000)
    with torch.inference_mode():
        kernel(x)

    def count(seconds: float) -> int:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += 1
        return n

    alone = count(1.0)
    stop = threading.Event()

    def run() -> None:
        with torch.inference_mode():
            while not stop.is_set():
                kernel(x)

    other = threading.Thread(target=run)
    other.start()
    time.sleep(0.1)
    beside = count(1.0)
    stop.set()
    other.join()
    return beside / alone


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=960, help="packed tokens per call (960: 64 questions of ~15 tokens)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--gil", choices=["torch", "patched"], help=argparse.SUPPRESS)  # the child processes
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.gil:
        print(f"{gil_ratio(args.gil == 'patched'):.2f}")
        return 0
    now = datetime.now(timezone.utc)
    print(f"# int8 kernels: {args.rows} rows, {args.threads} threads, {os.cpu_count()} CPUs ({platform.machine()}), "
          f"oneDNN ISA cap {os.environ.get('ONEDNN_MAX_CPU_ISA', 'none')}, torch {torch.__version__}, "
          f"{now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
    block_timings(args.rows)
    for binding in ("torch", "patched"):
        out = subprocess.run([sys.executable, __file__, "--gil", binding, "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        print(f"a Python loop beside a compiled kernel, {binding} binding: {out.stdout.split()[-1]}x its speed alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
