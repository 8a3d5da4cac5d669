"""RetrievalEngine: backend + corpus → documents per query; ``load_engine`` builds one from a ServerConfig.
Invariant: ``search`` and the file reads of ``pages`` run off the event loop; a text asked twice in a batch is encoded
and searched once. A document backend (web) has no corpus, and a query it failed holds its ``QueryFailed`` in place of
its hits; its ``search_documents`` is awaited per request, its live calls on the backend's own loop, never on the
batch worker."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from local_dense_retriever.config import ServerConfig, is_flat_ip, resolve_device
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.engine_meter import EngineMeter
from local_dense_retriever.errors import IndexLoadError, QueryFailed
from local_dense_retriever.index.base import DenseSearch, SearchBackend, VectorIndex
from local_dense_retriever.load_progress import LoadProgress
from local_dense_retriever.pages import CorpusPages, PageStore, url_of
from local_dense_retriever.rerank import Reranker, load_reranker

if TYPE_CHECKING:
    import numpy as np

    from local_dense_retriever.index.flat_file import VectorFile
    from local_dense_retriever.web.backend import WebSearch

logger = logging.getLogger(__name__)

Hit = tuple[dict, float]


@dataclass
class RetrievalEngine:
    """What the server serves: a search backend over a corpus."""

    backend: SearchBackend | WebSearch
    corpus: CorpusStore | None  # None: a document backend (web), whose hits are documents, not corpus rows
    load_seconds: dict[str, float] = field(default_factory=dict)
    page_file: PageStore | None = None  # the pages of --pages_path
    corpus_pages: CorpusPages | None = None  # pages joined from the corpus by url (pages)
    reranker: Reranker | None = None  # the rerank stage (--reranker_model)
    meter: EngineMeter = field(default_factory=EngineMeter)  # what its threads push for /metrics

    def __post_init__(self) -> None:
        if self.corpus is not None and len(self.backend) > len(self.corpus):
            raise IndexLoadError(
                f"index holds {len(self.backend):,} passages but the corpus only {len(self.corpus):,} rows"
            )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` (document, score) per query, best first; identical texts are searched once."""
        distinct = list(dict.fromkeys(queries))
        if len(distinct) == len(queries):
            return self._ranked(queries, k)
        self.meter.add_duplicates(len(queries) - len(distinct))
        answers = dict(zip(distinct, self._ranked(distinct, k), strict=True))
        return [answers[q] for q in queries]

    async def search_documents(self, queries: list[str], k: int, rerank=None) -> list[list[Hit] | QueryFailed]:
        """A document backend's (web) ``search``, awaited on the server's loop: the backend's calls run on its own
        loop, and the rerank stage (if any) through ``rerank``, an awaitable of ``(fn, *args)`` off this loop."""
        distinct = list(dict.fromkeys(queries))
        if len(distinct) != len(queries):
            self.meter.add_duplicates(len(queries) - len(distinct))
        n = max(k, self.reranker.candidates) if self.reranker is not None else k
        found = await self.backend.asearch(distinct, n)
        if self.reranker is not None:
            assert rerank is not None
            found = await rerank(self._rerank, distinct, found, k)
        answers = dict(zip(distinct, found, strict=True))
        return [answers[q] for q in queries]

    def _rerank(self, queries: list[str], hits: list, k: int) -> list:
        assert self.reranker is not None
        with self.meter.stage("rerank"):
            return self.reranker.rerank(queries, hits, k)

    def _ranked(self, queries: list[str], k: int) -> list[list[Hit]]:
        """``_search``'s hits, or with a rerank stage its candidates reordered by the reranker's score."""
        if self.reranker is None:
            return self._search(queries, k)
        return self._rerank(queries, self._search(queries, max(k, self.reranker.candidates)), k)

    def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        meter, backend = self.meter, self.backend
        if self.corpus is None:  # hits are documents already; a failed query is its QueryFailed
            with meter.stage("search"):
                return backend.search(queries, k)
        if isinstance(backend, DenseSearch):  # encoding and index search timed apart
            scores, ids = backend.search(queries, k, meter=meter)
            meter.set_crowded(self.prefilter_crowded())
        else:
            with meter.stage("search"):
                scores, ids = backend.search(queries, k)
        with meter.stage("lookup"):  # every hit gets its url (pages)
            docs = [[self.corpus.get(int(i)) for i in row] for row in ids]
            for doc in (d for row in docs for d in row):
                doc["url"] = url_of(doc)
            return [list(zip(row_d, map(float, row_s), strict=True)) for row_d, row_s in zip(docs, scores, strict=True)]

    def gpus(self) -> list[int]:
        """The CUDA ordinals (in this process's numbering) of the GPUs holding the index or the encoder."""
        devices = [*getattr(getattr(self.backend, "index", None), "devices", []), self._encoder_device()]
        # a bare 'cuda' is torch's current device, which the server never changes from 0
        return sorted({d.index or 0 for d in devices if d is not None and d.type == "cuda"})

    def _encoder_device(self) -> torch.device | None:
        return getattr(getattr(self.backend, "encoder", None), "device", None)  # BM25 and web have no encoder

    @property
    def encodes_on_gpu(self) -> bool:
        """Whether the query encoder runs on a GPU."""
        return getattr(self._encoder_device(), "type", None) == "cuda"

    def prefilter_crowded(self) -> int:
        """Queries the pre-scan found crowded (``accel.prescan``); 0 without one."""
        index = getattr(self.backend, "index", None)  # BM25 has no vector index; faiss no pre-scan
        return int(getattr(index, "crowded_queries", 0))

    async def pages(self, urls: list[str]) -> list[dict | None]:
        """``POST /access`` (awaited on the server's loop): per url, the pages file's page, else the one joined from
        the corpus rows, else a document backend's (web: its cache, else a live fetch), else None."""
        found: list[dict | None] = [None] * len(urls)
        if self.page_file is not None or self.corpus_pages is not None:  # file reads, off the loop
            found = await asyncio.to_thread(lambda: [self._local_page(url) for url in urls])
        missing = [i for i, page in enumerate(found) if page is None]
        if missing and self.corpus is None:  # a document backend (web) fetches the rest
            fetched = await self.backend.pages([urls[i] for i in missing])
            for i, page in zip(missing, fetched, strict=True):
                found[i] = page
        return found

    def _local_page(self, url: str) -> dict | None:
        page = self.page_file.get(url) if self.page_file is not None else None
        if page is None and self.corpus_pages is not None:
            page = self.corpus_pages.get(url)
        return page

    @property
    def passages(self) -> int | None:
        """Rows of the corpus served; None for a document backend (web), which has no corpus."""
        return len(self.corpus) if self.corpus is not None else None

    def index_report(self, k: int) -> dict | None:
        """The /health ``index`` field: what the dense index is, its search-time parameter and stored recall@``k``;
        None for a backend without a vector index (bm25, web) or one that cannot say."""
        info = getattr(getattr(self.backend, "index", None), "index_info", None)
        return info(k).to_dict() if callable(info) else None

    def backend_stats(self) -> dict | None:
        """The backend's own /metrics block (the web backend's cache and budget), if it keeps one."""
        stats = getattr(self.backend, "stats", None)
        return stats() if callable(stats) else None

    def close(self) -> None:
        """At shutdown: a document backend (web) closes its HTTP session and cache; local ones hold nothing open."""
        if self.corpus is None:
            self.backend.close()

    def describe(self) -> str:
        """What is served, naming files without their folders (this text is shown by /health)."""
        pages = f"; pages {self.page_file.path.name} ({len(self.page_file):,})" if self.page_file is not None else ""
        rerank = f"; {self.reranker.describe()}" if self.reranker is not None else ""
        corpus = f"; corpus {self.corpus.path.name} ({len(self.corpus):,} rows)" if self.corpus is not None else ""
        return f"{self.backend.describe()}{corpus}{pages}{rerank}"


@contextmanager
def _stage(log: dict[str, float], part: str, every_s: float, detail: str = "", unit: str = "bytes"):
    """One part of the load, logged as it starts and ends (its time kept in ``log``); its LoadProgress in between."""
    logger.info("loading %s%s", part, f" ({detail})" if detail else "")
    t0 = time.perf_counter()
    yield LoadProgress(part, every_s=every_s, unit=unit)
    log[part] = time.perf_counter() - t0
    logger.info("loaded %s in %.1f s", part, log[part])


def _torch_serves_faiss_gpu(config: ServerConfig) -> bool:
    """The published command asks for --faiss_gpu; without faiss-gpu, a flat index on CUDA is served by torch."""
    if not (config.faiss_gpu and config.backend == "auto" and torch.cuda.is_available()):
        return False
    import faiss

    return (not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0) and is_flat_ip(Path(config.index_path))


def load_flat_index(config: ServerConfig, source: Path | np.ndarray | VectorFile, **kw) -> VectorIndex:
    """The torch backend's index of ``source`` (a file, or rows of one), with the pre-scan ``accel.rule`` gives."""
    from local_dense_retriever.accel.rule import prescan_for
    from local_dense_retriever.index.torch_flat import TorchFlatIndex, index_source

    device = resolve_device(config.device)
    vectors = index_source(source, device, config.index_dtype) if isinstance(source, Path) else source
    scan = prescan_for(config.index_prefilter, device, config.index_dtype, tuple(vectors.shape))
    return TorchFlatIndex(vectors, device=device, dtype=config.index_dtype, score_bytes=config.score_buffer_mb << 20,
                          cpu_scan=scan, **kw)  # fmt: skip


def load_engine(config: ServerConfig, *, progress: bool = True, index: VectorIndex | None = None) -> RetrievalEngine:
    """Load the web backend, or (the embedded default: built once) encoder, index and corpus; then the pages and the
    rerank stage. ``index`` replaces the file's index."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    timings: dict[str, float] = {}
    every_s = config.load_progress_s
    corpus: CorpusStore | None = None
    if config.resolved_backend() == "web":  # the provider behind its cache, no corpus
        from local_dense_retriever.web.backend import WebSearch

        with _stage(timings, "web backend", every_s, f"{config.web_provider}, {config.web_cache_mode}"):
            backend: SearchBackend | WebSearch = WebSearch(config)
    else:
        corpus, backend = _local_backend(config, timings, progress, index)
    engine = RetrievalEngine(backend, corpus, load_seconds=timings)
    if config.pages_path is not None:
        with _stage(timings, "pages", every_s, Path(config.pages_path).name):
            engine.page_file = PageStore(Path(config.pages_path), progress=progress)
    if corpus is not None:
        with _stage(timings, "page urls", every_s, unit="rows") as stage:
            engine.corpus_pages = CorpusPages(corpus, progress=progress, load_progress=stage)
    if config.reranker_model is not None:
        with _stage(timings, "reranker", every_s, config.reranker_model):
            engine.reranker = load_reranker(config)
    logger.info("ready: %s (%.1f s total)", engine.describe(), sum(timings.values()))
    return engine


def _planned(config: ServerConfig, backend_name: str) -> tuple[ServerConfig, str, int | None]:
    """Log the memory plan; a flat index whose plan does not fit under --gpu_memory_fraction gives way to its CPU
    fallback (``cpu_fallback``). Returns the config and backend to load, and the flat rows when the fallback is."""
    from local_dense_retriever.cpu_fallback import choose
    from local_dense_retriever.memory_plan import make_plan

    plan = make_plan(config, backend_name)
    for line in plan.lines():
        logger.info("%s", line)
    if backend_name == "faiss" and plan.layout.rows == 0:  # not a flat index: served as it is
        return config, backend_name, None
    fallback = choose(config, plan)
    if fallback is None:
        return config, backend_name, None
    for line in make_plan(fallback, "faiss").lines():
        logger.info("%s", line)
    return fallback, "faiss", plan.layout.rows


def _local_backend(
    config: ServerConfig, timings: dict[str, float], progress: bool, index: VectorIndex | None
) -> tuple[CorpusStore, SearchBackend]:
    """The corpus and the bm25, torch or faiss backend over it."""
    from local_dense_retriever.encoder import encoder_for

    every_s = config.load_progress_s
    if config.embedded_default:
        from local_dense_retriever.toy.embedded_default import resolve_embedded_default

        with _stage(timings, "embedded default", every_s):
            config = resolve_embedded_default(config, progress=progress)
    assert config.corpus_path is not None
    if config.faiss_gpu and not torch.cuda.is_available():
        logger.warning("--faiss_gpu: no CUDA GPU is visible here; serving the index on the CPU instead")
        config = config.model_copy(update={"faiss_gpu": False})
    if index is None and config.index_path is not None and not Path(config.index_path).exists():  # fail early
        raise IndexLoadError(f"index file not found: {config.index_path}")
    backend_name = config.resolved_backend()
    if backend_name == "faiss" and _torch_serves_faiss_gpu(config):
        logger.warning(
            "--faiss_gpu: faiss has no GPU support here (pip faiss-cpu); serving the flat index with the "
            "torch backend sharded in fp16 over %d GPU(s) instead (same results)",
            torch.cuda.device_count(),
        )
        backend_name = "torch"
    flat_rows = None  # with a CPU fallback served: the flat index's rows, which it must hold too
    if index is None and backend_name != "bm25":  # before anything loads: what each device will hold
        config, backend_name, flat_rows = _planned(config, backend_name)
    with _stage(timings, "corpus", every_s, Path(config.corpus_path).name) as stage:
        corpus = CorpusStore(Path(config.corpus_path), progress=progress, load_progress=stage)
    backend: SearchBackend
    if backend_name == "bm25":
        from local_dense_retriever.index.bm25 import BM25Search, bm25_dir_for

        index_dir = Path(config.index_path) if config.index_path else bm25_dir_for(Path(config.corpus_path))
        with _stage(timings, "bm25 index", every_s, index_dir.name):
            backend = BM25Search(index_dir, corpus, progress=progress)
    else:
        assert config.index_path is not None
        with _stage(timings, "encoder", every_s, f"{config.retriever_model} on {resolve_device(config.device)}"):
            encoder = encoder_for(config)
        if index is None:
            with _stage(timings, f"{backend_name} index", every_s, Path(config.index_path).name) as stage:
                if backend_name == "torch":
                    index = load_flat_index(config, Path(config.index_path), progress=stage)
                else:
                    from local_dense_retriever.index.faiss_index import FaissIndex

                    index = FaissIndex(
                        Path(config.index_path),
                        gpu=config.faiss_gpu,
                        progress=stage,
                        nprobe=config.nprobe,
                        ef_search=config.ef_search,
                        recall_k=config.topk,
                    )
        if flat_rows is not None and len(index) != flat_rows:
            name = Path(config.index_path).name
            raise IndexLoadError(f"--cpu_index {name} holds {len(index):,} rows, the flat index {flat_rows:,}: not "
                                 "the same corpus")  # fmt: skip
        backend = DenseSearch(encoder, index)
        if callable(getattr(index, "index_info", None)):  # what is served: type, search-time parameter, recall, size
            logger.info("%s", index.index_info(config.topk).log_line())
    return corpus, backend
