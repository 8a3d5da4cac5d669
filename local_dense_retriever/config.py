"""ServerConfig: every retrieval-server setting with its default and meaning, declared once (CLI flags derive it);
and the backend rule that resolves its ``auto`` device and precisions from the device (CUDA, or the CPU's flags),
never timed, as the fields' help says. torch is imported only inside the rule's functions."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from local_dense_retriever.errors import EncoderError
from local_dense_retriever.web.settings import WebSettings

if TYPE_CHECKING:
    import torch

Backend = Literal["auto", "torch", "faiss", "bm25", "web"]
Pooling = Literal["auto", "mean", "cls"]
#: precision of the encoder and of the torch backend's vectors ('auto' resolves per device: ``encoder_dtype``)
Precision = Literal["auto", "float32", "float16", "bfloat16"]
#: the opt-in coarse pre-scan of a float32 flat index on the CPU (``local_dense_retriever.accel``)
Prefilter = Literal["auto", "bfloat16", "int8", "off"]

#: flags (and a flag's values) that were removed -> the one line the CLIs refuse them with, naming what replaced them
REMOVED_FLAGS = {
    "--encoder_dtype int8": "was removed (the int8 encoder): use --encoder_dtype auto (bfloat16 where the CPU has it "
    "natively, else float32) or float32",
    "--index_scan_layout": "was removed: the CPU scan has one layout; drop the flag",
    "--encoder_packed": "was removed: the encoder runs the model's own forward; drop the flag",
    "--no_encoder_packed": "was removed: the encoder runs the model's own forward; drop the flag",
}


def refuse_removed_flags(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Exit 2 with one line naming what replaced a removed flag or value of ``argv`` (``config.REMOVED_FLAGS``)."""
    words = list(sys.argv[1:] if argv is None else argv)
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        name = "--" + name[2:].replace("-", "_")
        value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        for key in (f"{name} {value}", name):
            if key in REMOVED_FLAGS:
                parser.exit(2, f"{parser.prog}: error: {key} {REMOVED_FLAGS[key]}\n")


def default_cache_dir() -> Path:
    """The machine-wide cache: ``$VERL_SEARCH_CACHE``, else ``$XDG_CACHE_HOME/verl_search``, else ``~/.cache/...``."""
    if os.environ.get("VERL_SEARCH_CACHE"):
        return Path(os.environ["VERL_SEARCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl_search"


class ServerConfig(WebSettings):
    """Configuration of the local retrieval service (the web backend's settings: ``WebSettings``). Unknown keys are
    rejected."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    # the published Search-R1 flags first, then our own
    index_path: Path | None = None
    """Flat/any faiss index file, a .npy of passage vectors, or a bm25s index directory. None (with corpus_path None)
    serves the embedded toy default."""
    corpus_path: Path | None = None
    """Corpus jsonl, one {id, contents} per line; row = id."""
    topk: int = Field(default=3, ge=1)
    """Passages per query when a request sends topk=null."""
    retriever_name: str = "e5"
    """Model family ('e5' adds query:/passage: prefixes; 'bm25' selects the bm25 backend)."""
    retriever_model: str = "intfloat/e5-base-v2"
    """HF model id or local folder of the query encoder."""
    reranker_model: str | None = None
    """HF id or local folder of a cross-encoder (sequence classification, 1 or 2 labels) that rescores each query's
    first rerank_candidates hits; the top k by its score are answered, with that score. None: no rerank stage."""
    rerank_candidates: int = Field(default=30, ge=1, le=1000)
    """Hits per query the reranker rescores (at least topk; a request asking more rescores that many)."""
    rerank_batch_size: int = Field(default=64, ge=1)
    """Most (query, passage) pairs in one reranker pass; a micro-batch's pairs are scored together in such passes."""
    rerank_max_length: int = Field(default=512, ge=16, le=8192)
    """Tokens kept per (query, passage) pair."""
    faiss_gpu: bool = False
    """faiss backend: shard an fp16 copy of the index over every visible GPU."""
    pages_path: Path | None = None
    """JSONL of full pages, one object with a 'url' key per line (ASearcher/RLinf), served first by POST /access; a url
    it lacks is answered from the corpus rows (--backend web: the web cache, else a live fetch), else null."""
    save_address_to: Path | None = None
    """Folder (made if missing) where, once ready, the server writes Host<ip>_IP<port>.txt holding <ip>:<port>
    (ASearcher/RLinf server discovery)."""
    faiss_gpu_id: int | None = Field(default=None, ge=0)
    """Accepted for SkyRL's launch script; we use every visible GPU (pick them with CUDA_VISIBLE_DEVICES)."""
    nprobe: int | None = Field(default=None, ge=1)
    """faiss IVF index: inverted lists searched per query (more: higher recall, slower); None: the value stored in the
    index file. Refused for an index without lists (HNSW, flat) and for the torch and bm25 backends."""
    ef_search: int | None = Field(default=None, ge=1)
    """faiss HNSW index: candidates kept while walking the graph (efSearch; more: higher recall, slower); None: the
    value stored in the index file. Refused for an index without a graph (IVF, flat) and for the torch and bm25
    backends."""
    gpu_memory_fraction: float = Field(default=0.9, gt=0, le=1)
    """Most share of each GPU's total memory the memory plan may use for a flat index on GPUs (torch on CUDA, or
    --faiss_gpu); over it the plan logs a warning recommending a compressed index on the CPU, or serves --cpu_index."""
    cpu_index: str | None = None
    """A compressed faiss index of the same corpus (built by build_index.py, with its .build.json record), served on
    the CPU instead of a flat index on GPUs whose plan exceeds gpu_memory_fraction. 'auto': of the indexes in the flat
    index's folder whose build record names it as its source and holds as many rows, the one with the highest stored
    recall@topk at its stored search value (none: the flat index is served, with a warning). None: no fallback."""

    @model_validator(mode="after")
    def _check_web(self) -> ServerConfig:
        if self.backend == "web" and (self.index_path is not None or self.corpus_path is not None):
            raise ValueError("--backend web searches the provider: drop --index_path and --corpus_path")
        if self.web_fetch_allow_loopback and not _is_loopback(self.host):
            raise ValueError(
                f"--web_fetch_allow_loopback is for tests: it would let clients of --host {self.host} reach this "
                "machine's own services through /access; listen on 127.0.0.1 or drop the flag"
            )
        return self

    host: str = "127.0.0.1"
    """Bind address (loopback unless you mean to expose it)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port (0 picks a free one)."""
    backend: Backend = "auto"
    """'auto': bm25 when retriever_name is bm25, torch for flat IP indexes and .npy, faiss otherwise."""
    device: str = Field(default="auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$")
    """Encoder device: auto, cpu, cuda or cuda:N; 'auto' uses CUDA when available."""
    fp16: bool = True
    """Allow a half-precision encoder under encoder_dtype 'auto' (--no_fp16: float32)."""
    encoder_dtype: Precision = "auto"
    """Encoder precision; 'auto' = float16 on CUDA, bfloat16 on a CPU with native bf16 (avx512_bf16 or amx_bf16),
    float32 on other CPUs."""
    index_dtype: Precision = "auto"
    """torch backend vector dtype; 'auto' = float16 on CUDA, float32 on CPU."""
    index_prefilter: Prefilter = "auto"
    """torch backend, float32 index on the CPU: scan a bfloat16 (half size) or int8 (quarter size) copy first, then
    re-score in float32 the rows within its proven error of the top k (float32's answers). 'auto' = on for indexes of 1M
    rows and more whose copy fits a quarter of the RAM: bfloat16 with amx_bf16, int8 with avx512_vnni or amx_int8, off
    elsewhere."""
    score_buffer_mb: int = Field(default=1024, ge=1)
    """torch backend: most MiB the (queries x rows) score buffer of one search step may take on each device; a GPU scans
    its shard in as many steps as this needs."""
    encoder_shape_multiple: int = Field(default=4, ge=1, le=64)
    """CPU encoder: pad each pass's token length, and a row count above this, to a multiple of this, so oneDNN compiles
    kernels for a few shapes, not one per batch size x length; 1 = no padding."""
    encoder_kernel_cache: int = Field(default=64, ge=1, le=4096)
    """CPU encoder: most compiled kernels oneDNN (and torch's ideep) keep, so rare batch shapes cannot grow memory for
    ever (ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY take precedence)."""
    pooling: Pooling = "auto"
    """'auto' = cls for bge models, mean otherwise."""
    query_max_length: int = Field(default=256, ge=8, le=8192)
    """Tokens kept per query."""
    num_threads: int = Field(default=0, ge=0)
    """torch/faiss CPU threads; 0 = all cores."""
    load_progress_s: float = Field(default=5.0, ge=0)
    """Seconds between the progress lines logged while the index, corpus and url table load; 0: a line per step read."""

    batching: bool = True
    """Coalesce concurrent requests into one encode + search. False = the per-request reference mode (each request alone
    on a thread of a pool, like the public servers)."""
    max_batch_size: int = Field(default=256, ge=1)
    """Most queries encoded and searched together."""
    max_batch_tokens: int = Field(default=8192, ge=1)
    """About the most query tokens in one engine call (estimated as characters/3, each query capped at
    query_max_length): long queries are split over several calls so no request holds others up."""
    max_wait_ms: float = Field(default=10.0, ge=0)
    """Longest a batch waits for more requests: for as many as the last batch had, then briefly for those that arrived
    while it ran (batcher.WaitPlan). No wait after a batch capped by size."""
    max_queue: int = Field(default=8192, ge=1)
    """Most queries waiting; more are answered 429."""
    malloc_trim_s: float = Field(default=30.0, ge=0)
    """Every this many seconds the C heap's free pages go back to the OS (malloc_trim); 0: never."""
    unbatched_threads: int | None = Field(default=None, ge=1)
    """Thread pool size of the per-request mode; default 40 with a CPU encoder, 1 with a GPU one (where concurrent
    passes only contend for the device and the interpreter)."""

    max_queries_per_request: int = Field(default=2560, ge=1)
    """Most queries in one request (Search-R1 sends a whole rollout turn: 512 x 5 = 2,560), served in micro-batches
    shared fairly with concurrent small requests."""
    max_query_chars: int = Field(default=4096, ge=1)
    """Most characters in one query."""
    max_topk: int = Field(default=100, ge=1)
    """Largest topk a request may ask for."""
    max_body_bytes: int = Field(default=4 << 20, ge=64)
    """Largest request body in bytes."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for a request's headers, then for its body, to arrive in full (then a JSON 408 and the connection is
    closed)."""

    watchdog_stall_s: float = Field(default=60.0, gt=0)
    """The batching worker counts as stuck when queries wait and no micro-batch has started or finished for this long:
    logged once, and /health answers 503 while it lasts."""
    watchdog_loop_block_s: float = Field(default=1.0, gt=0)
    """The event loop counts as blocked when it has not run for this long: logged once with the loop thread's stack,
    /health answers 503 while it lasts, and a SIGTERM it cannot honour ends the process."""

    toy_passages: int = Field(default=2000, ge=50)
    """Passages of the embedded default corpus (encoded on first start)."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Where the embedded default is cached (and, unless --web_cache_path says otherwise, the web backend's cache)."""

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if (self.index_path is None) != (self.corpus_path is None) and self.resolved_backend() != "bm25":
            raise ValueError("give both --index_path and --corpus_path, or neither (embedded default)")
        if self.reranker_model is not None and self.rerank_candidates < self.topk:
            raise ValueError(f"rerank_candidates={self.rerank_candidates} is below topk={self.topk}")
        if self.topk > self.max_topk:
            raise ValueError(f"topk={self.topk} exceeds max_topk={self.max_topk}")
        self._check_index_knobs()
        if self.max_queue < self.max_queries_per_request:
            raise ValueError(
                f"max_queue={self.max_queue} is below max_queries_per_request={self.max_queries_per_request}: "
                "a full request could never be queued"
            )
        return self

    def _check_index_knobs(self) -> None:
        """--nprobe / --ef_search need a faiss index (the fallback's, with --cpu_index); --cpu_index a flat one."""
        backend = self.resolved_backend()
        flat = backend == "torch" or (self.index_path is not None and is_flat_ip(self.index_path))
        for field, flag in (("nprobe", "--nprobe"), ("ef_search", "--ef_search")):
            if getattr(self, field) is None:
                continue
            if backend in ("bm25", "web"):
                raise ValueError(f"{flag} tunes a faiss index; the {backend} backend has none: drop it")
            if flat and self.cpu_index is None:
                raise ValueError(f"{flag} tunes a compressed faiss index (nprobe: IVF, ef_search: HNSW), but "
                                 f"{self.index_path or 'the embedded default'} is a flat index, searched exactly: drop "
                                 "it, or give --cpu_index for a compressed fallback it applies to")  # fmt: skip
        if self.cpu_index is None:
            return
        if backend in ("bm25", "web") or not flat:
            raise ValueError(f"--cpu_index is the CPU fallback of a flat index on GPUs; --index_path "
                             f"{self.index_path} is served by the {backend} backend as it is: drop it")  # fmt: skip
        if self.cpu_index != "auto" and not Path(self.cpu_index).is_file():
            raise ValueError(f"--cpu_index {self.cpu_index}: no such index file (give a file, or 'auto')")

    @property
    def embedded_default(self) -> bool:
        """True when no corpus was given: serve the generated toy corpus with the bundled MiniLM."""
        return self.corpus_path is None and self.backend != "web"

    def resolved_backend(self) -> Literal["torch", "faiss", "bm25", "web"]:
        """The backend actually used (resolves 'auto' from the retriever name and the index file)."""
        if self.backend != "auto":
            return self.backend
        if self.retriever_name.lower() == "bm25":
            return "bm25"
        if self.faiss_gpu:
            return "faiss"
        return "torch" if self.index_path is None or is_flat_ip(self.index_path) else "faiss"

    def requested_encoder_dtype(self) -> str:
        """encoder_dtype, with 'auto' turned into float32 by --no_fp16 (the device resolves the rest)."""
        return "float32" if self.encoder_dtype == "auto" and not self.fp16 else self.encoder_dtype

    def resolved_pooling(self) -> Literal["mean", "cls"]:
        if self.pooling != "auto":
            return self.pooling
        return "cls" if "bge" in f"{self.retriever_name} {self.retriever_model}".lower() else "mean"


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (only this machine can connect to a server bound there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_flat_ip(path: Path) -> bool:
    """A .npy or a faiss IndexFlatIP file (read from its 4-byte header, without loading it)."""
    if path.suffix == ".npy":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"IxFI"
    except OSError:
        return False


#: CPU flags of native bf16 matmuls (AVX-512 BF16, AMX)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags the CPU reports."""
    return frozenset(cpu_info().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name, or "unknown cpu"."""
    return cpu_info().get("model name", "unknown cpu")


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU with ``flags`` (this one's by default) has bf16 matmuls; torch's own check without cpuinfo."""
    if flags is not None or cpu_info():
        return bool((cpu_flags() if flags is None else flags) & set(BF16_FLAGS))
    import torch

    checks = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(check is not None and check() for check in checks)


def resolve_device(device: str) -> torch.device:
    """'auto' → cuda when available, else cpu; 'cuda' without a GPU is an error."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EncoderError("--device cuda was asked for but torch sees no CUDA GPU")
    return torch.device(device)


def encoder_dtype(requested: str, device: torch.device, flags: frozenset[str] | None = None) -> torch.dtype:
    """The encoder's precision: float16 on CUDA; bfloat16 on a CPU with native bf16 (``flags``: this one's by default),
    else float32; a named precision is kept."""
    import torch

    if requested == "auto":
        if device.type == "cuda":
            return torch.float16
        return torch.bfloat16 if native_bf16(flags) else torch.float32
    if requested not in get_args(Precision):
        raise EncoderError(f"unknown encoder dtype {requested!r}: use auto, float32, float16 or bfloat16")
    return getattr(torch, requested)


def reranker_dtype(device: torch.device, fp16: bool) -> torch.dtype:
    """The cross-encoder's precision: float16 on CUDA unless ``--fp16`` is off, else float32."""
    import torch

    return torch.float16 if device.type == "cuda" and fp16 else torch.float32


def index_dtype(requested: str, device: torch.device) -> str:
    """A flat index's precision: float16 on CUDA, float32 on the CPU; a named precision is kept."""
    if requested == "auto":
        return "float16" if device.type == "cuda" else "float32"
    return requested
