"""Linear layers in int8 on a CPU (W8A8): int8 weights, int8 activations, int32 sums, for CPUs without bf16 matmuls.

On a CPU with VNNI but neither AMX nor AVX-512 BF16 (Cascade Lake and Ice Lake Xeons), the float32 query encoder's
linear layers already run at ~91% of the float32 matmul peak, while an int8 matmul of the encoder's shapes runs
~3.8x faster than float32's there (``benchmarks/encoder_int8.py``). Each layer here keeps:

- its weight as int8 multiples of one scale per output channel (the largest magnitude of the row over 127);
- its input as int8 multiples of one scale per token (row), computed on every call: a token's rounding depends on
  that token alone, so a query's vector does not depend on its batch-mates (one scale per batch moved vectors by up
  to 5%); the int32 sums are exact;
- the bias, and the output, in float32: ``(x_q @ w_q^T) * x_scale * w_scale + bias``.

Run eagerly, the quantise and rescale steps around ``torch._int_mm`` cost more than the int8 matmul saves; so a BERT
layer's attention output (dense, residual, LayerNorm) and the two halves of its feed-forward block (dense and GELU;
dense, residual and LayerNorm) are each one function compiled by ``torch.compile`` (inductor, dynamic shapes: a C++ compiler must be
installed; compiled once per process, a few seconds, cached on disk by inductor), whose elementwise steps become a
few C++ loops around the int8 matmuls.

Invariant: every int8 module computes what the float32 module it replaces computes, but for the two roundings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

from local_dense_retriever.errors import EncoderError

logger = logging.getLogger(__name__)

_compiled: dict = {}
_compile_lock = threading.Lock()


def w8a8_linear(x: torch.Tensor, weight_t: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
    """``x`` (rows, in) float32 through int8 weights ``weight_t`` (in, out) with per-output scales; float32 out."""
    largest = x.abs().amax(1, keepdim=True).clamp(min=1e-12)
    q = (x * (127 / largest)).round().to(torch.int8)  # a product per element, not a (slower) quotient
    out = torch._int_mm(q, weight_t).to(torch.float32) * (largest / 127) * weight_scale
    return out if bias is None else out + bias


#: the activations a fused feed-forward block computes itself, by Hugging Face ``hidden_act`` name
ACTIVATIONS = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


def self_output(hidden, residual, weight_t, weight_scale, bias, norm_weight, norm_bias, eps: float):
    """``LayerNorm(dense(hidden) + residual)`` with the dense layer in int8: a BERT layer's attention output, and the
    second half of its feed-forward block."""
    out = w8a8_linear(hidden, weight_t, weight_scale, bias) + residual
    return torch.nn.functional.layer_norm(out, out.shape[-1:], norm_weight, norm_bias, eps)


def gelu_up(x, weight_t, weight_scale, bias, approximate: str):
    """The first half of a BERT layer's feed-forward block: ``gelu(dense(x))``, the dense layer in int8. Compiled
    apart from the second half (:func:`self_output`), which quantises its result: fused, inductor computed the GELU
    twice (once for the rows' largest values, once to quantise) and the block was 15% slower."""
    return torch.nn.functional.gelu(w8a8_linear(x, weight_t, weight_scale, bias), approximate=approximate)


def compile_once(fn):
    """``fn`` compiled once per process (dynamic shapes: one kernel for every row count); the quantise and rescale
    steps, the activation and the LayerNorm around the int8 matmuls become a few C++ loops."""
    import torch._inductor.config as inductor_config

    with _compile_lock:
        if fn not in _compiled:
            inductor_config.compile_threads = 1  # in this process: no pool of compile workers left behind the server
            _compiled[fn] = torch.compile(fn, dynamic=True)
        return _compiled[fn]


class Int8Linear(torch.nn.Module):
    """A float32 ``Linear`` run in int8 (:func:`w8a8_linear`); its float weight is not kept."""

    def __init__(self, linear: torch.nn.Linear, *, compiled: bool = True) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(1).clamp(min=1e-12) / 127
        self.register_buffer("weight_t", (w / scale[:, None]).round().to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._call = compile_once(w8a8_linear) if compiled else w8a8_linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = self._call(rows, self.weight_t, self.weight_scale, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights and inputs"


class Int8SelfOutput(torch.nn.Module):
    """A BERT layer's ``attention.output`` (dense, residual, LayerNorm; dropout is off in inference) in int8, as one
    compiled call (:func:`self_output`)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.dense = Int8Linear(module.dense, compiled=False)
        self.norm = module.LayerNorm
        self._call = compile_once(self_output)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        d, n = self.dense, self.norm
        return self._call(hidden, residual, d.weight_t, d.weight_scale, d.bias, n.weight, n.bias, n.eps)


class Int8FeedForward(torch.nn.Module):
    """A BERT layer's ``intermediate`` and ``output`` (dense, GELU, dense, residual, LayerNorm) in int8, as two
    compiled calls (:func:`gelu_up`, :func:`self_output`): ``x`` → the layer's output."""

    def __init__(self, intermediate: torch.nn.Module, output: torch.nn.Module, approximate: str) -> None:
        super().__init__()
        self.up = Int8Linear(intermediate.dense, compiled=False)
        self.down = Int8Linear(output.dense, compiled=False)
        self.norm = output.LayerNorm
        self.approximate = approximate
        self._up, self._down = compile_once(gelu_up), compile_once(self_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, d, n = self.up, self.down, self.norm
        inner = self._up(x, u.weight_t, u.weight_scale, u.bias, self.approximate)
        return self._down(inner, x, d.weight_t, d.weight_scale, d.bias, n.weight, n.bias, n.eps)


def quantize_linears(module: torch.nn.Module, *, compiled: bool = True) -> int:
    """Replace every ``Linear`` under ``module`` (``module`` itself excluded) with an :class:`Int8Linear`, in place;
    the number replaced."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child, compiled=compiled))
                count += 1
    return count


def check_int8_runs(run: Callable[[], object]) -> None:
    """Call ``run`` (a forward pass through int8 layers: it compiles them), or raise :class:`EncoderError` saying why
    the int8 layers cannot run here."""
    try:
        with torch.inference_mode():
            run()
    except Exception as e:  # inductor raises many types (no compiler, unsupported op); all mean the same to a user
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EncoderError(
            f"the int8 encoder cannot run here ({type(e).__name__}: {first}): it needs torch.compile with a C++ "
            "compiler (g++); use --encoder_dtype float32"
        ) from e
