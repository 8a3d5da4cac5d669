"""The coarse copies of a float32 flat index that :mod:`~local_dense_retriever.accel.prescan` scans first: the rows in
bfloat16 (:class:`Bf16Copy`) or int8 with one scale (:class:`Int8Copy`), each with a proven bound on how far its scores
can be from float32's (:meth:`CoarseCopy.bounds`), which the pre-scan's margin is built from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from local_dense_retriever.index.scan import RowsRead

#: unit roundoff of bfloat16 (8 significant bits, round to nearest even) and of float32 (24 bits)
BF16_ROUNDOFF = 2.0**-8
FP32_ROUNDOFF = 2.0**-24
#: an int8 copy's values: symmetric, so that -128 (which has no positive twin) never appears
INT8_LEVELS = 127
#: the float64 rows an int8 copy is checked in at a time (the residuals' norms): a few such temporaries per step
INT8_STEP_BYTES = 8 << 20
#: ``scores_out(queries, rows, dtype)``: the buffer a step's matmul writes into
ScoresOut = Callable[[int, int, torch.dtype], torch.Tensor]


def _nothing(lo: int, hi: int) -> None:
    pass


class CoarseCopy(Protocol):
    """A float32 index's rows in a coarser dtype, whose scores' error against float32's is bounded."""

    name: str
    dtype: torch.dtype
    rows: torch.Tensor
    #: passes the copy's making reads the float32 rows in
    passes: int
    #: groups of columns (``index.topk.GROUP``) whose rows are kept per query and block beyond k: their maxima must
    #: reach below the margin too
    extra_groups: int

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(coarse queries, unit)``: the queries (float32) in the copy's dtype, and per query the float64 ``unit``
        that turns its coarse scores into scores (``q . x ~ unit * coarse score``)."""
        ...

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        """The coarse scores of ``coarse`` (from :meth:`prepared`) against rows ``[lo, hi)``."""
        ...

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """Per query (float32 rows of ``queries``) a bound ``e`` (float64) such that, for every row ``x`` of the
        index, the pre-scan's score ``t`` (coarse score times unit, as compared) and the float32 re-score ``s'`` of
        ``q . x`` satisfy ``|t - q.x| + |s' - q.x| <= e``."""
        ...


def _slack(dim: int) -> float:
    """How much a norm computed in float32 over ``dim`` terms may be raised to stay an upper bound."""
    return 1 + 2 * (dim + 2) * FP32_ROUNDOFF


def _largest_norms(
    near: torch.Tensor, block: torch.Tensor, max_norm: float, max_residual: float
) -> tuple[float, float]:
    """``(max_norm, max_residual)`` raised to the largest norm of a row of ``near`` (``block``'s rows as the copy
    holds them, in the dtype the norms are taken in) and of a row's residual; ``near`` is overwritten with
    ``near - block``, so that a step needs no temporary the size of its rows."""
    norm = float(torch.linalg.vector_norm(near, dim=1).max())
    residual = float(torch.linalg.vector_norm(near.sub_(block), dim=1).max())
    return max(max_norm, norm), max(max_residual, residual)


def _fp32_sum_error(dim: int) -> float:
    """float32's relative error accumulated over a sum of ``dim`` products (``dim u / (1 - dim u)``)."""
    return dim * FP32_ROUNDOFF / (1 - dim * FP32_ROUNDOFF)


@dataclass(frozen=True)
class Bf16Copy:
    """A float32 index's rows in bfloat16, and the two numbers its scores' error is bounded by: the largest norm of a
    bf16 row and the largest norm of a row's rounding residual ``x - bf16(x)``. For CPUs with AMX (bf16 tiles)."""

    rows: torch.Tensor
    max_norm: float
    max_residual: float
    name = "bfloat16"
    dtype = torch.bfloat16
    passes = 1
    extra_groups = 32

    @classmethod
    def of(cls, vectors: torch.Tensor, rows_per_step: int, rows_read: RowsRead = _nothing) -> Bf16Copy:
        """The copy of ``vectors`` (float32), made ``rows_per_step`` rows at a time: no float32 copy of the whole
        index is ever made (``rows_read`` is told after each step). The norms are computed in float32 and raised by
        its worst relative error over ``dim`` terms (the residual ``x - bf16(x)`` itself is exact in float32: it is
        the low bits of ``x``)."""
        rows = torch.empty(vectors.shape, dtype=torch.bfloat16)
        near = torch.empty((min(rows_per_step, len(vectors)), vectors.shape[1]))  # one step's workspace, reused
        max_norm = max_residual = 0.0
        for lo in range(0, len(vectors), rows_per_step):
            block = vectors[lo : lo + rows_per_step]
            rounded = rows[lo : lo + len(block)]
            rounded.copy_(block)
            max_norm, max_residual = _largest_norms(near[: len(block)].copy_(rounded), block, max_norm, max_residual)
            rows_read(lo, lo + len(block))
        slack = _slack(vectors.shape[1])
        return cls(rows, max_norm * slack, max_residual * slack)

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return queries.to(torch.bfloat16), torch.ones(len(queries), dtype=torch.float64)

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        rows = self.rows[lo:hi]
        return torch.matmul(coarse, rows.T, out=out(len(coarse), len(rows), torch.bfloat16))

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """With ``q_b``, ``x_b`` the bf16 roundings, ``N`` the largest ``|x_b|``, ``R`` the largest ``|x - x_b|``,
        ``u`` bf16's roundoff and ``g`` float32's accumulated over ``dim`` terms:

        - ``q . x - q_b . x_b = q . (x - x_b) + (q - q_b) . x_b``: at most ``|q| R + |q - q_b| N`` (Cauchy-Schwarz);
        - the products of bf16 numbers are exact in float32 (AMX and AVX512-BF16 multiply so); summing them in
          float32: ``g |q_b| N``;
        - the matmul writes bf16 scores (torch has no float32 output for bf16 inputs on the CPU): ``u (1 + g) |q_b|
          N``;
        - the float32 re-score ``s'``: ``g |q| (N + R)``;
        - denormals flushed to zero (inputs and products below 2^-126): ``dim 2^-126 (2 + |q_b| + N)``;
        - and float32's rounding of the threshold the bound is subtracted from: ``4 2^-24 (|q_b| N + |q| (N + R))``.
        """
        dim = queries.shape[1]
        u, g = BF16_ROUNDOFF, _fp32_sum_error(dim)
        q = queries.double()
        q_b = queries.to(torch.bfloat16).double()
        norm, norm_b = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(q_b, dim=1)
        residual = torch.linalg.vector_norm(q - q_b, dim=1)
        n, r = self.max_norm, self.max_residual
        e = norm * r + residual * n + (g + u * (1 + g)) * norm_b * n + g * norm * (n + r)
        e += dim * 2.0**-126 * (2 + norm_b + n) + 4 * FP32_ROUNDOFF * (norm_b * n + norm * (n + r))
        return e


@dataclass(frozen=True)
class Int8Copy:
    """A float32 index's rows as int8 multiples of one ``scale`` (one for the whole index, so that the int32 scores of
    a query are comparable across rows), the largest norm of a row so rounded (``scale * x_i``) and the largest norm
    of a row's rounding residual ``x - scale * x_i``. For CPUs with VNNI or AMX (int8 dot products, int32 sums):
    a quarter of the index's size."""

    rows: torch.Tensor
    scale: float
    max_norm: float
    max_residual: float
    name = "int8"
    dtype = torch.int8
    passes = 2  # the scale, then the rows
    extra_groups = 64  # the int8 bound is wider than bf16's: more rows fall within it

    @classmethod
    def of(cls, vectors: torch.Tensor, rows_per_step: int, rows_read: RowsRead = _nothing) -> Int8Copy:
        """The copy of ``vectors`` (float32) in two passes of ``rows_per_step`` rows (the scale, then the rows): no
        float32 copy of the whole index is ever made (``rows_read`` is told after each step of each pass). The norms
        are computed in float64 from the exact residuals, a step of at most :data:`INT8_STEP_BYTES` of them at a
        time."""
        rows_per_step = max(1, min(rows_per_step, INT8_STEP_BYTES // (8 * vectors.shape[1])))
        largest = 0.0
        for lo in range(0, len(vectors), rows_per_step):
            largest = max(largest, float(vectors[lo : lo + rows_per_step].abs().max()))
            rows_read(lo, min(lo + rows_per_step, len(vectors)))
        scale = largest / INT8_LEVELS if largest > 0 else 1.0
        rows = torch.empty(vectors.shape, dtype=torch.int8)
        # one step's workspace, reused: the load's memory is the copy and these, whatever malloc keeps
        shape = (min(rows_per_step, len(vectors)), vectors.shape[1])
        ratio, near, wide = (
            torch.empty(shape),
            torch.empty(shape, dtype=torch.float64),
            torch.empty(shape, dtype=torch.float64),
        )
        step, max_norm, max_residual = torch.tensor([[scale]]), 0.0, 0.0
        for lo in range(0, len(vectors), rows_per_step):
            block = vectors[lo : lo + rows_per_step]
            n = len(block)
            rounded = rows[lo : lo + n]
            rounded.copy_(_quantised(block, step, out=ratio[:n]))
            near[:n].copy_(rounded).mul_(scale)  # exact: an int of 8 bits times a float32
            max_norm, max_residual = _largest_norms(near[:n], wide[:n].copy_(block), max_norm, max_residual)
            rows_read(lo, lo + n)
        return cls(rows, scale, max_norm * (1 + 2.0**-40), max_residual * (1 + 2.0**-40))

    def prepared(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step = _query_steps(queries)
        return _quantised(queries, step), step.double().flatten() * self.scale

    def scores(self, coarse: torch.Tensor, lo: int, hi: int, out: ScoresOut) -> torch.Tensor:
        rows = self.rows[lo:hi]
        return torch._int_mm(coarse, rows.T, out=out(len(coarse), len(rows), torch.int32))

    def bounds(self, queries: torch.Tensor) -> torch.Tensor:
        """With ``t q_i`` the query so rounded (``t`` its own step), ``N`` the largest ``|s x_i|``, ``R`` the largest
        ``|x - s x_i|`` and ``g`` float32's error accumulated over ``dim`` terms:

        - ``q . x - t s (q_i . x_i) = q . (x - s x_i) + (q - t q_i) . s x_i``: at most ``|q| R + |q - t q_i| N``;
        - the int32 sums are exact (``127^2 dim < 2^31``), but they are compared in float32 (rounded beyond 2^24):
          ``2^-24 |t q_i| N``;
        - the float32 re-score ``s'``: ``g |q| (N + R)``, and its denormals, ``dim 2^-126 (2 + |q| + N)``;
        - and float32's rounding of the threshold the bound is subtracted from: ``4 2^-24 (|t q_i| N + |q| (N +
          R))``.
        """
        dim = queries.shape[1]
        if INT8_LEVELS**2 * dim >= 2**31:
            raise ValueError(f"an int8 pre-scan's int32 sums overflow beyond {2**31 // INT8_LEVELS**2 - 1} dims")
        g = _fp32_sum_error(dim)
        step = _query_steps(queries)
        q = queries.double()
        q_i = _quantised(queries, step).double() * step.double()
        norm, norm_i = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(q_i, dim=1)
        residual = torch.linalg.vector_norm(q - q_i, dim=1)
        n, r = self.max_norm, self.max_residual
        e = norm * r + residual * n + FP32_ROUNDOFF * norm_i * n + g * norm * (n + r)
        e += dim * 2.0**-126 * (2 + norm + n) + 4 * FP32_ROUNDOFF * (norm_i * n + norm * (n + r))
        return e * (1 + 2.0**-40)


def _query_steps(queries: torch.Tensor) -> torch.Tensor:
    """Per query (a column), the step of its int8 rounding: its largest coordinate is 127 steps (1 for a zero
    query)."""
    largest = queries.abs().amax(dim=1, keepdim=True)
    return torch.where(largest > 0, largest / INT8_LEVELS, torch.ones_like(largest))


def _quantised(x: torch.Tensor, step: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (float32) in int8 multiples of ``step`` (broadcast over rows), rounded to nearest, within +-127; with
    ``out`` (float32, ``x``'s shape), the whole numbers are left there instead."""
    whole = torch.div(x, step, out=out).round_().clamp_(-INT8_LEVELS, INT8_LEVELS)
    return whole if out is not None else whole.to(torch.int8)
