"""The rerank stage: a cross-encoder rescores each query's first ``candidates`` hits of any backend and the top k by
its score are answered, with that score. Invariant: one call scores every (query, passage) pair of the micro-batch
together, in passes of at most ``batch_size`` pairs; equal scores keep the retriever's order. The cross-encoder
(``AutoModelForSequenceClassification`` + ``AutoTokenizer``, one folder) scores by its one output logit, or the second
(positive) class's of two; more labels, or a missing classification head (an encoder's weights), are refused."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from local_dense_retriever.config import ServerConfig, reranker_dtype, resolve_device
from local_dense_retriever.errors import QueryFailed, RerankerError

logger = logging.getLogger(__name__)

Hit = tuple[dict, float]
#: (query, passage) pairs -> one relevance score per pair, higher is better (the stage's seam)
PairScorer = Callable[[list[tuple[str, str]]], list[float]]


class CrossEncoder:
    """A Hugging Face sequence-classification model as a PairScorer (see the module's convention)."""

    def __init__(
        self, model: str | Path, *, device: str = "auto", fp16: bool = True, max_length: int = 512, batch_size: int = 64
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = resolve_device(device)
        self.dtype = reranker_dtype(self.device, fp16)
        self.max_length, self.batch_size = max_length, batch_size
        if str(model).startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
            raise RerankerError(f"reranker folder not found: {model}")
        model = Path(model).expanduser() if str(model).startswith("~") else model
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model))
            loaded, info = AutoModelForSequenceClassification.from_pretrained(str(model), output_loading_info=True)
        except (OSError, ValueError, KeyError) as e:
            raise RerankerError(f"cannot load reranker {model!r}: {e}") from e
        untrained = [key for key in info.get("missing_keys", ()) if "classifier" in key or "score" in key]
        if untrained:
            raise RerankerError(
                f"reranker {model!r} has no trained classification head ({', '.join(sorted(untrained))} missing): "
                "give a cross-encoder folder, not an encoder's"
            )
        labels = int(loaded.config.num_labels)
        if labels > 2:
            raise RerankerError(f"reranker {model!r} has {labels} output labels: a cross-encoder has 1 (or 2)")
        self.column = 0 if labels == 1 else 1
        self.model = loaded.to(device=self.device, dtype=self.dtype).eval()
        self.precision = str(self.dtype).removeprefix("torch.")

    @torch.inference_mode()
    def __call__(self, pairs: list[tuple[str, str]]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            batch = self.tokenizer([q for q, _ in chunk], [p for _, p in chunk], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt")  # fmt: skip
            logits = self.model(**{name: t.to(self.device) for name, t in batch.items()}).logits
            scores.extend(logits[:, self.column].float().cpu().tolist())
        return scores


@dataclass
class Reranker:
    """``score`` (a PairScorer) over each query's first ``candidates`` hits; ``name`` says what it is."""

    score: PairScorer
    candidates: int
    name: str = "scorer"

    def rerank(self, queries: list[str], hits: list[list[Hit] | QueryFailed], k: int) -> list[list[Hit] | QueryFailed]:
        """Each query's hits rescored by ``score`` (all pairs in one call), the best ``k`` first; a query that failed
        (its ``QueryFailed`` in its slot, from a document backend) stays failed."""
        pairs = [
            (query, str(doc.get("contents", "")))
            for query, row in zip(queries, hits, strict=True)
            if not isinstance(row, QueryFailed)
            for doc, _ in row
        ]
        scores = self.score(pairs) if pairs else []
        if len(scores) != len(pairs):
            raise RerankerError(f"the reranker returned {len(scores)} scores for {len(pairs)} pairs")
        out: list[list[Hit] | QueryFailed] = []
        at = 0
        for row in hits:
            if isinstance(row, QueryFailed):
                out.append(row)
                continue
            mine = [float(s) if not math.isnan(s) else -math.inf for s in scores[at : at + len(row)]]
            at += len(row)
            rescored = sorted(zip((doc for doc, _ in row), mine, strict=True), key=lambda hit: -hit[1])  # stable
            out.append(rescored[:k])
        return out

    def describe(self) -> str:
        return f"rerank {self.name} over {self.candidates} candidates"


def load_reranker(config: ServerConfig) -> Reranker:
    """The stage ``config`` asks for (``reranker_model`` must be set)."""
    assert config.reranker_model is not None
    scorer = CrossEncoder(config.reranker_model, device=config.device, fp16=config.fp16,
                          max_length=config.rerank_max_length, batch_size=config.rerank_batch_size)  # fmt: skip
    name = f"{Path(config.reranker_model).name} in {scorer.precision} on {scorer.device}"
    logger.info("reranker: %s, %d candidates per query", name, config.rerank_candidates)
    return Reranker(scorer, config.rerank_candidates, name)
