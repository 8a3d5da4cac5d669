"""BM25Search: lexical search with bm25s; the index is built from the corpus once, saved, and memory-mapped after.

Invariant: a saved index directory is complete (written under a temporary name, then renamed).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.errors import IndexLoadError
from verl_search.atomic import atomic_path, exclusive

logger = logging.getLogger(__name__)

_STOPWORDS = "en"


def bm25_dir_for(corpus_path: Path) -> Path:
    """Default location of the bm25s index of ``corpus_path``: beside it."""
    return corpus_path.with_name(corpus_path.name + ".bm25")


def is_lucene_index(path: Path) -> bool:
    """A Lucene (Pyserini) index folder: Lucene's ``segments_N`` file at its top or one level down."""
    return path.is_dir() and (any(path.glob("segments_*")) or any(path.glob("*/segments_*")))


def build_bm25(corpus: CorpusStore, out_dir: Path, *, progress: bool = True) -> None:
    """Tokenize every passage, index it and save the index atomically to ``out_dir``."""
    import bm25s
    from tqdm import tqdm

    texts = (corpus.get(i)["contents"] for i in tqdm(range(len(corpus)), desc="bm25 tokenize", disable=not progress))
    tokens = bm25s.tokenize(list(texts), stopwords=_STOPWORDS, show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=progress)
    with atomic_path(out_dir) as tmp:
        retriever.save(str(tmp), show_progress=False)


class BM25Search:
    """Query texts → (scores, row ids) with a bm25s index."""

    def __init__(self, index_dir: Path, corpus: CorpusStore, *, build: bool = True, progress: bool = True) -> None:
        import bm25s

        index_dir = Path(index_dir)
        if not (index_dir / "params.index.json").is_file():
            if index_dir.exists() and not index_dir.is_dir():
                raise IndexLoadError(f"{index_dir} is a file, not a bm25s index directory")
            if is_lucene_index(index_dir):  # Search-R1's BM25 command points at the downloaded Pyserini index
                own = bm25_dir_for(corpus.path)
                logger.warning(
                    "%s is a Lucene (Pyserini) index, which this server does not read; serving BM25 with its own bm25s "
                    "index %s built from the corpus instead (%s)",
                    index_dir,
                    own,
                    "loading it" if (own / "params.index.json").is_file() else "building it once",
                )
                index_dir = own
        if not (index_dir / "params.index.json").is_file():
            if index_dir.is_dir() and any(index_dir.iterdir()):  # never write a new index into someone's folder
                raise IndexLoadError(
                    f"{index_dir} is not a bm25s index; leave out --index_path to build one beside the corpus once "
                    f"({bm25_dir_for(corpus.path)}), or point it at an empty folder"
                )
            if not build:
                raise IndexLoadError(f"no bm25s index at {index_dir}")
            # servers started together on one corpus take turns: the first builds, the others find it built
            with exclusive(index_dir.with_name(f".{index_dir.name}.build.lock"), f"the bm25 index {index_dir}"):
                if not (index_dir / "params.index.json").is_file():
                    logger.info("building bm25 index %s from %s (once)", index_dir, corpus.path)
                    build_bm25(corpus, index_dir, progress=progress)
        self._retriever = bm25s.BM25.load(str(index_dir), mmap=True, show_progress=False)
        self._n = len(corpus)
        self._dir = index_dir
        self._threads = os.cpu_count() or 1

    def __len__(self) -> int:
        return self._n

    def describe(self) -> str:
        return f"bm25s index {self._dir.name} over {self._n:,} passages"

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        import bm25s

        tokens = bm25s.tokenize(queries, stopwords=_STOPWORDS, return_ids=False, show_progress=False)
        ids, scores = self._retriever.retrieve(tokens, k=min(k, self._n), show_progress=False)
        return np.asarray(scores, dtype=np.float32), np.asarray(ids, dtype=np.int64)
