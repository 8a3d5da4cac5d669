"""How the int8 query encoder is calibrated and checked: the smoothing factors (SmoothQuant) set from the input
ranges its linear layers see over :data:`CALIBRATION_QUERIES`, and the two checks it passes before it serves (its
compiled layers run here; its vectors agree with float32's).

Invariant: an int8 encoder that cannot run here, or whose vectors are not within :data:`MIN_AGREEMENT` of float32's
on the calibration queries, raises :class:`EncoderError` at start-up instead of serving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from local_dense_retriever.errors import EncoderError

T = TypeVar("T")


#: SmoothQuant's migration strength: how much of each input column's range moves into the weight (0: none)
SMOOTHING_ALPHA = 0.5

#: queries whose activations set the smoothing factors (a model's outlier columns are its own, whatever the text):
#: questions of the shapes rollouts send a search engine, short and long, one and two hops
CALIBRATION_QUERIES = (
    "who wrote the novel the old man and the sea",
    "when did the first human land on the moon",
    "what is the capital city of australia",
    "how many players are on a rugby union team",
    "which river flows through the city of budapest",
    "who was the president of the united states during the civil war",
    "what year was the eiffel tower completed",
    "where was the composer of the magic flute born",
    "what is the boiling point of water at sea level in fahrenheit",
    "which company makes the playstation game console",
    "who played the lead role in the film casablanca",
    "what language is spoken in the country north of brazil called suriname",
    "when was the university that alan turing attended founded",
    "how long is the great wall of china",
    "what element has the chemical symbol fe",
    "who directed the movie that won best picture in 1998",
    "in which country is the mountain kilimanjaro",
    "what is the population of the largest city in canada",
    "which band released the album abbey road",
    "who discovered penicillin and in what year",
    "what is the name of the longest bone in the human body",
    "which ocean lies between africa and australia",
    "who is the author of a brief history of time",
    "what currency is used in switzerland",
    "when did the berlin wall fall",
    "who founded the company that makes the iphone",
    "what sport does the team real madrid play",
    "which planet has the most moons in the solar system",
    "where is the headquarters of the united nations located",
    "who painted the ceiling of the sistine chapel",
    "what is the official language of the country whose capital is lima",
    "how many states are there in the united states of america",
    "which city hosted the summer olympic games in 2008",
    "who was the first woman to win a nobel prize",
    "what is the tallest building in the world as of today",
    "when was the declaration of independence signed",
    "who sang the song that was number one in the uk charts in july 1985",
    "what is the main ingredient of guacamole",
    "which author created the detective sherlock holmes",
    "in what year did the titanic sink and how many people died",
    "what is the speed of light in a vacuum",
    "who is the current head of state of the country where the river danube ends",
    "which football club has won the most european cups",
    "what type of animal is a komodo dragon",
    "where did the inventor of the telephone die",
    "x",
    "capital of france",
    "the birth place of the scientist who proposed the theory of general relativity and the year he moved to the "
    "united states to work at the institute for advanced study in princeton",
)


def smoothing(input_max: torch.Tensor, weight: torch.Tensor, alpha: float = SMOOTHING_ALPHA) -> torch.Tensor:
    """A factor per input column, ``max|x_j|^alpha / max|w_:,j|^(1 - alpha)`` (SmoothQuant, Xiao et al. 2023): the
    inputs divided by it and the weight's columns multiplied by it compute the same product, with the columns' ranges
    evened out, so that a token's few outlier columns (BERT models have some) no longer set the int8 step of all its
    others. Rows are still scaled per token on every call, so an input beyond the calibrated range is never clipped."""
    column_max = weight.detach().float().abs().amax(0).clamp(min=1e-5)
    return (input_max.float().clamp(min=1e-5) ** alpha / column_max ** (1 - alpha)).clamp(min=1e-5)


class InputRanges:
    """Records, per ``Linear`` given, the largest magnitude each input column takes while it is open (a forward
    pre-hook each; removed on exit): ``ranges[module]``."""

    def __init__(self, modules: list[torch.nn.Linear]) -> None:
        self.modules = modules
        self.ranges: dict[torch.nn.Module, torch.Tensor] = {}
        self._hooks: list = []

    def _record(self, module: torch.nn.Module, args: tuple) -> None:
        seen = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
        known = self.ranges.get(module)
        self.ranges[module] = seen if known is None else torch.maximum(known, seen)

    def __enter__(self) -> InputRanges:
        self._hooks = [m.register_forward_pre_hook(self._record) for m in self.modules]
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()

    def smooth(self, module: torch.nn.Linear) -> torch.Tensor | None:
        """:func:`smoothing` for ``module``, or None when no input reached it."""
        seen = self.ranges.get(module)
        return None if seen is None else smoothing(seen, module.weight)


def check_int8_runs(run: Callable[[], T]) -> T:
    """``run()`` (a forward pass through int8 layers: it compiles them), or :class:`EncoderError` saying why the int8
    layers cannot run here."""
    try:
        with torch.inference_mode():
            return run()
    except Exception as e:  # inductor raises many types (no compiler, unsupported op); all mean the same to a user
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EncoderError(
            f"the int8 encoder cannot run here ({type(e).__name__}: {first}): it needs torch.compile with a C++ "
            "compiler (g++); use --encoder_dtype float32"
        ) from e


#: the int8 encoder is refused at start-up when a calibration query's vector is further than this from float32's
#: (cosine; MiniLM's worst over 512 toy questions was 0.9983)
MIN_AGREEMENT = 0.98


def check_int8_agrees(int8_vectors: torch.Tensor, float32_vectors: torch.Tensor) -> None:
    """Raise :class:`EncoderError` unless the int8 encoder's vectors of the calibration queries are finite and each
    within :data:`MIN_AGREEMENT` (cosine) of the float32 encoder's: wrong int8 arithmetic (saturating sums, a kernel
    cache built for another instruction set) would otherwise serve garbage quietly."""
    cosine = (int8_vectors * float32_vectors).sum(-1)
    worst = float(cosine.min()) if bool(torch.isfinite(cosine).all()) else float("nan")
    if not worst >= MIN_AGREEMENT:
        raise EncoderError(
            f"the int8 encoder disagrees with float32 on its calibration queries (worst cosine {worst:.4f}, needs "
            f"{MIN_AGREEMENT}): this CPU's int8 arithmetic or its compiled kernels are wrong; use --encoder_dtype "
            "float32 (or clear TORCHINDUCTOR_CACHE_DIR)"
        )
