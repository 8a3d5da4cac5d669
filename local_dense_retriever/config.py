"""ServerConfig: every retrieval-server setting with its default and meaning, declared once (CLI flags derive it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["auto", "torch", "faiss", "bm25"]
Pooling = Literal["auto", "mean", "cls"]
#: precision of the encoder and of the torch backend's vectors ('auto' resolves per device)
Precision = Literal["auto", "float32", "float16", "bfloat16"]
#: the query encoder's precisions: the vectors', and int8 linear layers on a CPU (local_dense_retriever.int8_linear)
EncoderPrecision = Literal["auto", "float32", "float16", "bfloat16", "int8"]
#: the torch backend's coarse pre-scan of a float32 CPU index (local_dense_retriever.index.prefilter)
Prefilter = Literal["auto", "bfloat16", "int8", "off"]
#: the torch backend's CPU scan: how its matmul is laid out (local_dense_retriever.index.scan_layout)
ScanLayout = Literal["auto", "queries_first", "rows_first"]


def default_cache_dir() -> Path:
    """The project's machine-wide cache: ``$VERL_SEARCH_CACHE``, else ``$XDG_CACHE_HOME/verl_search``, else
    ``~/.cache/verl_search``. The one definition: the embedded default corpus and index, the local tokenizer, the
    toy worlds and the base models all live under it."""
    if os.environ.get("VERL_SEARCH_CACHE"):
        return Path(os.environ["VERL_SEARCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl_search"


class ServerConfig(BaseModel):
    """Configuration of the local retrieval service. Unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- what to serve (the published Search-R1 flags) ---
    index_path: Path | None = Field(
        default=None,
        description="Flat/any faiss index file, a .npy of passage vectors, or a bm25s index directory. "
        "None (with corpus_path None) serves the embedded toy default.",
    )
    corpus_path: Path | None = Field(default=None, description="Corpus jsonl, one {id, contents} per line; row = id.")
    topk: int = Field(default=3, ge=1, description="Passages per query when a request sends topk=null.")
    retriever_name: str = Field(
        default="e5", description="Model family ('e5' adds query:/passage: prefixes; 'bm25' selects the bm25 backend)."
    )
    retriever_model: str = Field(
        default="intfloat/e5-base-v2", description="HF model id or local folder of the query encoder."
    )
    faiss_gpu: bool = Field(
        default=False, description="faiss backend: shard an fp16 copy of the index over every visible GPU."
    )
    pages_path: Path | None = Field(
        default=None,
        description="JSONL of full pages, one object with a 'url' key per line (ASearcher/RLinf): served by POST "
        "/access. Not given: /access answers null for every url.",
    )
    save_address_to: Path | None = Field(
        default=None,
        description="Folder (made if missing) where, once ready, the server writes Host<ip>_IP<port>.txt holding "
        "<ip>:<port> (ASearcher/RLinf server discovery).",
    )
    faiss_gpu_id: int | None = Field(
        default=None,
        ge=0,
        description="Accepted for SkyRL's launch script; we use every visible GPU (pick them with "
        "CUDA_VISIBLE_DEVICES).",
    )

    # --- our own flags ---
    host: str = Field(default="127.0.0.1", description="Bind address (loopback unless you mean to expose it).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 picks a free one).")
    backend: Backend = Field(
        default="auto",
        description="'auto': bm25 when retriever_name is bm25, torch for flat IP indexes and .npy, faiss otherwise.",
    )
    device: str = Field(
        default="auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="Encoder device: auto, cpu, cuda or cuda:N; 'auto' uses CUDA when available.",
    )
    fp16: bool = Field(
        default=True, description="Allow a half-precision encoder under encoder_dtype 'auto' (--no_fp16: float32)."
    )
    encoder_dtype: EncoderPrecision = Field(
        default="auto",
        description="Encoder precision; 'auto' = float16 on CUDA; on a CPU with bf16 instructions (avx512_bf16, "
        "amx_bf16) bfloat16 when a start-up probe finds it faster, else float32; for the server's queries on a CPU "
        "with VNNI and no AMX, int8 where it can run (with bf16 instructions: where a start-up probe finds it 1.1x "
        "faster than that float choice); index building never takes int8. 'int8' (CPU, BERT-family encoders, a C++ "
        "compiler for torch.compile): int8 linear layers, for CPUs without bf16 matmuls (VNNI).",
    )
    index_dtype: Precision = Field(
        default="auto", description="torch backend vector dtype; 'auto' = float16 on CUDA, float32 on CPU."
    )
    index_prefilter: Prefilter = Field(
        default="auto",
        description="torch backend, float32 index on the CPU: keep a coarse copy too (bfloat16: half the index's size "
        "again; int8: a quarter) and scan it first, scoring in float32 only the rows whose coarse score is within "
        "its proven rounding error of the top k, so the answers stay float32's (however tightly a query's scores "
        "crowd); 'auto' = on for indexes of 32k rows and more, whose copy takes at most a quarter of the RAM: "
        "bfloat16 on CPUs with AMX (3-4x the float32 matmul), int8 on CPUs with VNNI but no AMX (about 3x; their "
        "bf16 matmul is slower than float32's), off elsewhere.",
    )
    index_scan_layout: ScanLayout = Field(
        default="auto",
        description="torch backend, index on the CPU: compute a batch's scores as queries x rows (queries_first) or "
        "as rows x queries in cache-sized blocks (rows_first); the answers are the same. Which is faster depends on "
        "the CPU's BLAS and the batch (on an AMD Zen 3 rows first is 1.9-3.1x faster at 2-8 queries, 1.3-1.5x at "
        "32-64, even at 1 and 256); 'auto' times both at five batch sizes at the first start on a CPU (under a "
        "second; indexes of 32k rows and more), remembers the result in the cache directory unless the machine was "
        "busy, and gives each batch the faster one.",
    )
    score_buffer_mb: int = Field(
        default=1024,
        ge=1,
        description="torch backend: most MiB the (queries x rows) score buffer of one search step may take on each "
        "device, beside the index; a GPU scans its shard in as many steps as this needs. Larger is somewhat faster "
        "for big batches on a GPU with memory to spare.",
    )
    encoder_shape_multiple: int = Field(
        default=4,
        ge=1,
        le=64,
        description="CPU encoder: pad each forward pass's token length, and a row count above this, up to a "
        "multiple of this (padding rows are dropped; a packed pass rounds its token count instead, by at most "
        "12.5%), so oneDNN compiles and caches kernels for a few shapes instead of one per batch size x length, "
        "whose cache grows the heap by hundreds of MB under varied load; 1 = no padding.",
    )
    encoder_packed: bool = Field(
        default=True,
        description="CPU encoder: run a BERT-family model (bert, roberta, xlm-roberta) on its real tokens only, the "
        "padding of shorter texts never going through its matmuls (1.1-1.3x faster here; the same vectors to float "
        "rounding); --no_encoder_packed runs the model's own padded forward. Other models always run padded.",
    )
    encoder_kernel_cache: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="CPU encoder: most compiled kernels kept by oneDNN (and as many kernel descriptors by torch's "
        "ideep). Each new batch shape compiles a few, about 1 MB each, so without a small bound a long run's memory "
        "keeps growing as rare batch sizes turn up; a kernel evicted and needed again is recompiled in about a "
        "millisecond. ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY in the environment take precedence.",
    )
    pooling: Pooling = Field(default="auto", description="'auto' = cls for bge models, mean otherwise.")
    query_max_length: int = Field(default=256, ge=8, le=8192, description="Tokens kept per query.")
    num_threads: int = Field(default=0, ge=0, description="torch/faiss CPU threads; 0 = all cores.")

    load_progress_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds between the progress lines the server logs while it loads (index read and copied to "
        "its devices, corpus and url tables built); 0: a line per step read.",
    )

    # --- batching ---
    batching: bool = Field(
        default=True,
        description="Coalesce concurrent requests into one encode + search. False = per-request reference mode "
        "(each request encodes and searches on its own in a thread pool, like the public servers).",
    )
    max_batch_size: int = Field(default=256, ge=1, description="Most queries encoded and searched together.")
    max_batch_tokens: int = Field(
        default=8192,
        ge=1,
        description="About the most query tokens in one engine call (estimated as characters/3, each query capped at "
        "query_max_length): long queries are split over several calls so no request holds others up.",
    )
    max_wait_ms: float = Field(
        default=10.0,
        ge=0,
        description="Longest a batch waits for more requests: for as many as the last batch had (closed-loop callers "
        "send again when answered), then, for at most 5% of the last batch's engine time, for those plus the ones that "
        "arrived while it ran (so callers split into cohorts merge again). No wait after a batch capped by size.",
    )
    max_queue: int = Field(default=8192, ge=1, description="Most queries waiting; more are answered 429.")
    malloc_trim_s: float = Field(
        default=30.0,
        ge=0,
        description="Every this many seconds the C heap's free pages go back to the OS (glibc's malloc_trim), so RSS "
        "follows what is in use; 0: never.",
    )
    unbatched_threads: int | None = Field(
        default=None,
        ge=1,
        description="Thread pool size of the per-request mode; default 40 with a CPU encoder, 1 with a GPU one (where "
        "concurrent single-query passes only contend for the device and the interpreter: 40 threads halved the mode's "
        "q/s on an H200 and quadrupled its CPU per query).",
    )

    # --- request limits ---
    max_queries_per_request: int = Field(
        default=2560,
        ge=1,
        description="Most queries in one request (Search-R1 sends a whole rollout turn: 512 x 5 = 2,560). Large "
        "requests are served in micro-batches shared fairly with concurrent small ones.",
    )
    max_query_chars: int = Field(default=4096, ge=1, description="Most characters in one query.")
    max_topk: int = Field(default=100, ge=1, description="Largest topk a request may ask for.")
    max_body_bytes: int = Field(default=4 << 20, ge=64, description="Largest request body in bytes.")
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait for a request's headers, then for its body, to arrive in full (then a JSON 408 "
        "and the connection is closed).",
    )

    # --- watchdog ---
    watchdog_stall_s: float = Field(
        default=60.0,
        gt=0,
        description="The batching worker counts as stuck when queries wait and no micro-batch has started or finished "
        "for this long (well above the slowest engine call): logged once, and /health answers 503 while it lasts.",
    )
    watchdog_loop_block_s: float = Field(
        default=1.0,
        gt=0,
        description="The event loop counts as blocked when it has not run for this long: logged once with the "
        "loop thread's stack, /health answers 503 while it lasts, and a SIGTERM it cannot honour ends the process.",
    )

    # --- embedded default ---
    toy_passages: int = Field(
        default=2_000, ge=50, description="Passages of the embedded default corpus (encoded on first start)."
    )
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Where the embedded default is cached.")

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if (self.index_path is None) != (self.corpus_path is None) and self.resolved_backend() != "bm25":
            raise ValueError("give both --index_path and --corpus_path, or neither (embedded default)")
        if self.topk > self.max_topk:
            raise ValueError(f"topk={self.topk} exceeds max_topk={self.max_topk}")
        if self.max_queue < self.max_queries_per_request:
            raise ValueError(
                f"max_queue={self.max_queue} is below max_queries_per_request={self.max_queries_per_request}: "
                "a full request could never be queued"
            )
        return self

    @property
    def embedded_default(self) -> bool:
        """True when no corpus was given: serve the generated toy corpus with the bundled MiniLM."""
        return self.corpus_path is None

    def resolved_backend(self) -> Literal["torch", "faiss", "bm25"]:
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

    @property
    def score_buffer_bytes(self) -> int:
        """score_buffer_mb in bytes, as the torch backend takes it."""
        return self.score_buffer_mb << 20

    def resolved_pooling(self) -> Literal["mean", "cls"]:
        if self.pooling != "auto":
            return self.pooling
        return "cls" if "bge" in f"{self.retriever_name} {self.retriever_model}".lower() else "mean"


def is_flat_ip(path: Path) -> bool:
    """A .npy or a faiss IndexFlatIP file (read from its 4-byte header, without loading it)."""
    if path.suffix == ".npy":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"IxFI"
    except OSError:
        return False
