"""The int8 query encoder for CPUs without bf16 hardware: speed and agreement with float32, against other int8 schemes.

    python benchmarks/encoder_int8.py [--passages 2000] [--questions 512] [--rounds 7]

The bundled MiniLM encoder (the server's ``HFEncoder``) in float32, bfloat16 and three int8 schemes of its Linear
layers, all on this CPU in one process:

- ``int8-tensor``: ``torch.ao.quantization.quantize_dynamic`` (fbgemm), one activation scale per call, per-tensor
  weight scales: PyTorch's stock dynamic quantisation, real int8 kernels (VNNI where the CPU has it, no AMX).
- ``int8-channel``: the same with per-output-channel weight scales (``per_channel_dynamic_qconfig``).
- ``int8-token``: one activation scale per token and per-channel weights, *simulated* in float32 (round to the int8
  grid, multiply in float): the numerics of the served int8 encoder, with no speed of its own.
- ``int8 (served)``: the server's ``--encoder_dtype int8`` (``local_dense_retriever.int8_linear``): the same scheme
  with real int8 matmuls, its elementwise steps compiled, run packed as the server runs it.

For each: queries per second at batch 64 (best of ``--rounds``, tokenisation and pooling included, as the server
runs it), the cosine between its question vectors and float32's, how often its top-3 passages over a toy corpus (the
passages encoded once in float32) are float32's, and how far a question's vector moves when it is encoded in a batch
of 64 rather than alone (1 - cosine): a server's answer to one client must not depend on its batch-mates.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_dense_retriever.cpu_features import cpu_has_amx  # noqa: E402
from local_dense_retriever.encoder import HFEncoder, bundled_minilm_path  # noqa: E402
from local_dense_retriever.encoder_precision import cpu_bf16_flags  # noqa: E402
from local_dense_retriever.packed_encoder import PackedEncoder  # noqa: E402
from local_dense_retriever.toy.questions import generate_questions  # noqa: E402
from local_dense_retriever.toy.world import ToyWorld  # noqa: E402

BATCH = 64


class PerTokenInt8Linear(torch.nn.Module):
    """A Linear layer whose inputs and weights are rounded to int8 grids (a scale per token, a scale per output
    channel) and multiplied in float32: the numerics of a per-token W8A8 kernel, not its speed."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        self.w_scale = w.abs().amax(1).clamp(min=1e-8) / 127
        self.w_grid = (w / self.w_scale[:, None]).round().clamp(-127, 127)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a_scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
        out = ((x / a_scale).round().clamp(-127, 127) @ self.w_grid.T) * a_scale * self.w_scale
        return out if self.bias is None else out + self.bias


def per_token_int8(model: torch.nn.Module) -> torch.nn.Module:
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, PerTokenInt8Linear(child))
    return model


def variants(fp32: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    torch.backends.quantized.engine = "fbgemm"
    return {
        "float32": fp32,
        "bfloat16": copy.deepcopy(fp32).to(torch.bfloat16),
        "int8-tensor": quantize_dynamic(copy.deepcopy(fp32), {torch.nn.Linear}, dtype=torch.qint8),
        "int8-channel": quantize_dynamic(copy.deepcopy(fp32), {torch.nn.Linear: per_channel_dynamic_qconfig}),
        "int8-token": per_token_int8(fp32),
    }


def packed_or_none(model: torch.nn.Module, token_multiple: int) -> PackedEncoder | None:
    """The packed forward pass of ``model``, or None where its layers are not plain Linears (the quantised ones)."""
    try:
        return PackedEncoder(model, token_multiple=token_multiple)
    except ValueError:
        return None


def encode_all(enc: HFEncoder, texts: list[str], *, is_query: bool = True) -> torch.Tensor:
    return torch.cat([enc.encode(texts[i : i + BATCH], is_query=is_query) for i in range(0, len(texts), BATCH)])


def queries_per_second(enc: HFEncoder, texts: list[str], rounds: int) -> float:
    batch = texts[:BATCH]
    enc.encode(batch)  # warm-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        enc.encode(batch)
        best = min(best, time.perf_counter() - t0)
    return len(batch) / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, default=2_000, help="toy corpus size (encoded once, float32)")
    p.add_argument("--questions", type=int, default=512, help="toy questions compared")
    p.add_argument("--rounds", type=int, default=7, help="timed batches per variant (best of)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", module="torch")  # torch.ao.quantization's deprecation notices
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    world = ToyWorld(args.passages, seed=0)
    questions = [q["question"] for q in generate_questions(world, args.questions)]
    enc = HFEncoder(bundled_minilm_path(), retriever_name="minilm", device="cpu", dtype="float32")
    passages = encode_all(enc, [world.passage(r) for r in range(world.num_passages)], is_query=False)
    models = variants(enc.model)
    reference = None
    now = datetime.now(timezone.utc)
    print(f"# int8 encoder: all-MiniLM-L6-v2, {os.cpu_count()} CPUs, AMX={cpu_has_amx()}, "
          f"bf16 flags={cpu_bf16_flags()}, "
          f"torch {torch.__version__}, {now:%Y-%m-%d %H:%M} UTC; {args.questions} toy questions, "
          f"{world.num_passages} passages")  # fmt: skip
    print(f"{'encoder':13} {'q/s at 64':>9} {'vs fp32':>8} {'cos min':>8} {'cos mean':>9} {'top-3 = fp32':>12} "
          f"{'batch drift max':>15}")  # fmt: skip
    served = HFEncoder(bundled_minilm_path(), retriever_name="minilm", device="cpu", dtype="int8")
    runs = [(name, enc, model) for name, model in models.items()] + [("int8 (served)", served, None)]
    for name, encoder, model in runs:
        if model is not None:  # run packed as the server does where the variant's layers allow, else padded
            enc.model, enc.packed = model, packed_or_none(model, enc.shape_multiple)
        qps = None if name == "int8-token" else queries_per_second(encoder, questions, args.rounds)
        vectors = encode_all(encoder, questions)
        top3 = (vectors @ passages.T).topk(3, dim=1).indices.sort(dim=1).values
        alone = torch.cat([encoder.encode([q]) for q in questions[:BATCH]])
        drift = (1 - (alone * vectors[:BATCH]).sum(1)).max().item()
        if reference is None:
            reference = (qps, vectors, top3)
        cos = (vectors * reference[1]).sum(1)
        same = (top3 == reference[2]).all(1).float().mean().item()
        speed = "simulated" if qps is None else f"{qps:>9.0f} {qps / reference[0]:>7.2f}x"
        name += "" if encoder is served or enc.packed is not None else " (padded)"
        print(f"{name:13} {speed:>18} {cos.min().item():>8.5f} {cos.mean().item():>9.5f} {same:>12.1%} "
              f"{drift:>15.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
