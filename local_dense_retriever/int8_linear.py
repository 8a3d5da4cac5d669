"""Linear layers in int8 on a CPU (W8A8): int8 weights, int8 activations, int32 sums, for CPUs without bf16 matmuls.

On a CPU with VNNI but neither AMX nor AVX-512 BF16 (Cascade Lake and Ice Lake Xeons), the float32 query encoder's
linear layers already run at ~91% of the float32 matmul peak, while an int8 matmul of the encoder's shapes runs
~3.8x faster than float32's there. Each layer here keeps:

- its weight as int8 multiples of one scale per output channel (the largest magnitude of the row over 127);
- its input as int8 multiples of one scale per token (row), computed on every call: a token's rounding depends on
  that token alone, so a query's vector does not depend on its batch-mates but through float noise (one scale per
  batch moved vectors by up to 5%); the int32 sums are exact;
- a smoothing factor per input column (:func:`smoothing`, from the inputs' ranges over :data:`CALIBRATION_QUERIES`),
  which moves half of each column's range into the weight, so that BERT's few outlier columns no longer set the
  int8 step of a token's other columns;
- the bias, and the output, in float32: ``((x / s)_q @ (w s)_q^T) * x_scale * w_scale + bias``.

Run eagerly, the quantise and rescale steps around ``torch._int_mm`` cost more than the int8 matmul saves. So a BERT
layer's attention output (dense, residual, LayerNorm) and the two halves of its feed-forward block (dense and GELU;
dense, residual and LayerNorm) are each one function compiled by ``torch.compile``: inductor, dynamic shapes, a C++
compiler needed; compiled once per process in a few seconds (inductor keeps the result on disk for the next start),
their elementwise steps become a few C++ loops around the int8 matmuls.

Invariant: every int8 module computes what the float32 module it replaces computes, but for the roundings.
"""

from __future__ import annotations

import logging
import threading

import torch

from local_dense_retriever.cpu_features import FULL_LEVELS
from local_dense_retriever.int8_calibration import (  # noqa: F401  (moved there; still importable from here)
    CALIBRATION_QUERIES,
    MIN_AGREEMENT,
    SMOOTHING_ALPHA,
    InputRanges,
    check_int8_agrees,
    check_int8_runs,
    smoothing,
)

logger = logging.getLogger(__name__)

_compiled: dict = {}
_compile_lock = threading.Lock()


def w8a8_linear(x: torch.Tensor, weight_t: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                input_scale: torch.Tensor | None = None):  # fmt: skip
    """``x`` (rows, in) float32 through int8 weights ``weight_t`` (in, out) with per-output scales; float32 out.
    ``input_scale``: each input column's factor before rounding (:func:`smoothing`; the weight holds its inverse)."""
    if input_scale is not None:
        x = x * input_scale
    largest = x.abs().amax(1, keepdim=True).clamp(min=1e-12)
    q = (x * (127 / largest)).round().to(torch.int8)  # a product per element, not a (slower) quotient
    out = torch._int_mm(q, weight_t).to(torch.float32) * (largest / 127) * weight_scale
    return out if bias is None else out + bias


#: the activations a fused feed-forward block computes itself, by Hugging Face ``hidden_act`` name
ACTIVATIONS = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


def self_output(hidden, residual, norm_weight, norm_bias, eps: float, weight_t, weight_scale, bias, input_scale):
    """``LayerNorm(dense(hidden) + residual)`` with the dense layer in int8: a BERT layer's attention output, and the
    second half of its feed-forward block."""
    out = w8a8_linear(hidden, weight_t, weight_scale, bias, input_scale) + residual
    return torch.nn.functional.layer_norm(out, out.shape[-1:], norm_weight, norm_bias, eps)


def gelu_up(x, approximate: str, weight_t, weight_scale, bias, input_scale):
    """The first half of a BERT layer's feed-forward block: ``gelu(dense(x))``, the dense layer in int8. Compiled
    apart from the second half (:func:`self_output`), which quantises its result: fused, inductor computed the GELU
    twice (once for the rows' largest values, once to quantise) and the block was 6-10% slower
    (``benchmarks/int8_kernels.py``)."""
    return torch.nn.functional.gelu(w8a8_linear(x, weight_t, weight_scale, bias, input_scale), approximate=approximate)


#: the call inductor's Python binding of a compiled C++ kernel makes, as this torch writes it: the GIL stays held
_INDUCTOR_ENTRY = "kernel({}); Py_RETURN_NONE;"
#: the same call with the GIL released while the kernel runs (its arguments are read from Python first)
_RELEASED_ENTRY = (
    "struct NoGil {{ PyThreadState* saved; NoGil() : saved(PyEval_SaveThread()) {{}} "
    "~NoGil() {{ PyEval_RestoreThread(saved); }} }}; "
    "[&](auto... a) {{ NoGil released; kernel(a...); }}({}); Py_RETURN_NONE;"
)


def release_gil_in_compiled_kernels() -> bool:
    """Make inductor's C++ kernels release the GIL while they run, as torch's own operators do: held, a compiled
    kernel stopped the server's event-loop thread for its whole run (a Python loop beside one got half its speed)
    and serialised the per-request mode's threads. Only where inductor's binding is the one this was written against
    (torch 2.13: ``CppPythonBindingsCodeCache.call_entry_function``); elsewhere it is left as it is. Whether it
    applied."""
    try:
        from torch._inductor.codecache import CppPythonBindingsCodeCache as bindings
    except ImportError:
        return False
    entry = getattr(bindings, "call_entry_function", None)
    if entry == _INDUCTOR_ENTRY:
        bindings.call_entry_function = _RELEASED_ENTRY
    elif entry != _RELEASED_ENTRY:
        logger.info("inductor's kernel binding is not the one known: its kernels keep the GIL while they run")
        return False
    return True


def compile_once(fn):
    """``fn`` compiled once per process (dynamic shapes: one kernel for every row count); the quantise and rescale
    steps, the activation and the LayerNorm around the int8 matmuls become a few C++ loops."""
    import torch._inductor.config as inductor_config

    with _compile_lock:
        if fn not in _compiled:
            inductor_config.compile_threads = 1  # in this process: no pool of compile workers left behind the server
            release_gil_in_compiled_kernels()
            _compiled[fn] = torch.compile(fn, dynamic=True)
        return _compiled[fn]


class Int8Linear(torch.nn.Module):
    """A float32 ``Linear`` run in int8 (:func:`w8a8_linear`); its float weight is not kept. ``smooth``: a factor
    per input column (:func:`smoothing`) moved from the inputs into the weight before both are rounded."""

    def __init__(
        self,
        linear: torch.nn.Linear,
        *,
        compiled: bool = True,
        smooth: torch.Tensor | None = None,
        weight_levels: int = FULL_LEVELS,
    ) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        if smooth is not None:
            w = w * smooth
        scale = w.abs().amax(1).clamp(min=1e-12) / weight_levels  # 7-bit where 8-bit weights saturate
        self.register_buffer("weight_t", (w / scale[:, None]).round().to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.register_buffer("input_scale", None if smooth is None else (1 / smooth).float())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._call = compile_once(w8a8_linear) if compiled else w8a8_linear

    def args(self) -> tuple:
        """What :func:`w8a8_linear` takes after the input, for this layer."""
        return self.weight_t, self.weight_scale, self.bias, self.input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = self._call(rows, *self.args())
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights and inputs"


class Int8SelfOutput(torch.nn.Module):
    """A BERT layer's ``attention.output`` (dense, residual, LayerNorm; dropout is off in inference) in int8, as one
    compiled call (:func:`self_output`)."""

    def __init__(
        self, module: torch.nn.Module, smooth: torch.Tensor | None = None, weight_levels: int = FULL_LEVELS
    ) -> None:
        super().__init__()
        self.dense = Int8Linear(module.dense, compiled=False, smooth=smooth, weight_levels=weight_levels)
        self.norm = module.LayerNorm
        self._call = compile_once(self_output)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        n = self.norm
        return self._call(hidden, residual, n.weight, n.bias, n.eps, *self.dense.args())


class Int8FeedForward(torch.nn.Module):
    """A BERT layer's ``intermediate`` and ``output`` (dense, GELU, dense, residual, LayerNorm) in int8, as two
    compiled calls (:func:`gelu_up`, :func:`self_output`): ``x`` → the layer's output."""

    def __init__(
        self,
        intermediate: torch.nn.Module,
        output: torch.nn.Module,
        approximate: str,
        smooth: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
        weight_levels: int = FULL_LEVELS,
    ) -> None:
        super().__init__()
        self.up = Int8Linear(intermediate.dense, compiled=False, smooth=smooth[0], weight_levels=weight_levels)
        self.down = Int8Linear(output.dense, compiled=False, smooth=smooth[1], weight_levels=weight_levels)
        self.norm = output.LayerNorm
        self.approximate = approximate
        self._up, self._down = compile_once(gelu_up), compile_once(self_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm
        inner = self._up(x, self.approximate, *self.up.args())
        return self._down(inner, x, n.weight, n.bias, n.eps, *self.down.args())


def quantize_linears(
    module: torch.nn.Module, *, ranges: InputRanges | None = None, weight_levels: int = FULL_LEVELS
) -> None:
    """Replace every ``Linear`` under ``module`` (``module`` itself excluded) with an :class:`Int8Linear`, in place,
    smoothed by ``ranges`` where it recorded the layer."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                smooth = None if ranges is None else ranges.smooth(child)
                setattr(parent, name, Int8Linear(child, smooth=smooth, weight_levels=weight_levels))
