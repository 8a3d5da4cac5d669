"""The encoder-backend interface (:class:`Encoder`: one L2-normalised float32 row per text, in order, on its device;
called from one thread at a time) and its plain backend (:class:`HFEncoder`: ``AutoModel`` in ``config.encoder_dtype``'s
precision, masked mean or CLS pooling, e5/bge prefixes). :func:`encoder_for` is the one place the server and the index
builder make it, so both pool and prefix alike."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Protocol

import torch

from local_dense_retriever.config import ServerConfig, encoder_dtype, resolve_device
from local_dense_retriever.errors import EncoderError
from local_dense_retriever.memory import bound_kernel_caches

logger = logging.getLogger(__name__)

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


class Encoder(Protocol):
    """Texts in, vectors of width ``dim`` out (see the module docstring)."""

    dim: int
    device: torch.device
    precision: str

    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor: ...


def text_prefixes(retriever_name: str, retriever_model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) as Search-R1 applies them: e5 → 'query: '/'passage: ', bge → instruction."""
    name = f"{retriever_name} {retriever_model}".lower()
    if "e5" in name:
        return "query: ", "passage: "
    if "bge" in name:
        return BGE_QUERY_INSTRUCTION, ""
    return "", ""


class HFEncoder:
    """A Hugging Face ``AutoModel`` query/passage encoder."""

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
    ) -> None:
        """``shape_multiple`` and ``kernel_cache`` bound the kernels oneDNN compiles per input shape on the CPU, so
        memory stays flat: a pass's length and rows are padded to a multiple of ``shape_multiple``."""
        from transformers import AutoModel, AutoTokenizer

        self.device = resolve_device(device)
        cpu = self.device.type == "cpu"
        if kernel_cache is not None and cpu:
            logger.info("CPU kernel caches: %s", bound_kernel_caches(kernel_cache))
        self.pooling, self.max_length = pooling, max_length
        self.shape_multiple = shape_multiple if cpu else 1
        self.query_prefix, self.passage_prefix = text_prefixes(retriever_name, str(model_name_or_path))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_name_or_path))
            model = AutoModel.from_pretrained(str(model_name_or_path))
        except (OSError, ValueError) as e:
            raise EncoderError(f"cannot load encoder {model_name_or_path!r}: {e}") from e
        self.dim = int(model.config.hidden_size)
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # unused (pooled here from last_hidden_state): a matmul less per pass
        self.dtype = encoder_dtype(dtype, self.device)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.precision = str(self.dtype).removeprefix("torch.")
        logger.info("encoder: %s in %s on %s", Path(str(model_name_or_path)).name, self.precision, self.device)

    @torch.inference_mode()
    def encode(self, texts: list[str], *, is_query: bool = True) -> torch.Tensor:
        """L2-normalised embeddings, float32, shape ``(len(texts), dim)``, on ``self.device``."""
        if not texts:
            return torch.empty(0, self.dim, device=self.device)
        prefix = self.query_prefix if is_query else self.passage_prefix
        texts = [prefix + t for t in texts]
        n, m = len(texts), self.shape_multiple
        if m > 1 and n > m:  # a few row counts, each compiled once; fewer rows than m are left as they are
            texts = texts + [""] * (-n % m)
        multiple = m if m > 1 and self.max_length % m == 0 else None  # the tokenizer refuses a max_length off it
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                               pad_to_multiple_of=multiple, return_tensors="pt")  # fmt: skip
        batch = {name: t.to(self.device) for name, t in batch.items()}
        states = self.model(**batch).last_hidden_state.float()
        if self.pooling == "cls":
            emb = states[:, 0]
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
            emb = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(emb[:n], dim=-1)


def encoder_for(config: ServerConfig, *, device: str | None = None, max_length: int | None = None) -> HFEncoder:
    """The encoder ``config`` describes; ``device`` and ``max_length`` default to the server's."""
    return HFEncoder(
        config.retriever_model,
        retriever_name=config.retriever_name,
        pooling=config.resolved_pooling(),
        device=device or config.device,
        dtype=config.requested_encoder_dtype(),
        max_length=max_length or config.query_max_length,
        shape_multiple=config.encoder_shape_multiple,
        kernel_cache=config.encoder_kernel_cache,
    )
