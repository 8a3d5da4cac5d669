"""Query batches tokenised by the Rust tokenizer itself: the tensors the Hugging Face wrapper returns, in about half
its time (the wrapper's per-call set-up and its Python lists are most of the cost for short queries).

Invariants, for ``BatchTokenizer(tok, n, m)(texts)``:
- every text is truncated to ``n`` tokens, and the batch is padded to its longest text rounded up to a multiple of
  ``m``, but never past ``n`` (the wrapper refuses an ``n`` that is not a multiple of ``m``; here such an ``n`` only
  adds one width, ``n`` itself);
- where ``n`` is a multiple of ``m`` (or ``m`` is None) the tensors are the wrapper's, key for key:
  ``tok(texts, padding=True, truncation=True, max_length=n, pad_to_multiple_of=m, return_tensors="pt")``;
- a tokenizer whose settings this does not reproduce (a slow one) goes through that wrapper call, with ``m`` dropped
  where the wrapper would refuse it.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

#: the wrapper outputs this reproduces, and the ``tokenizers.Encoding`` field each comes from
_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


class BatchTokenizer:
    """``tokenizer``'s padding and truncation for a batch of texts, as int64 tensors."""

    def __init__(self, tokenizer, max_length: int, pad_to_multiple_of: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.names: list[str] = list(getattr(tokenizer, "model_input_names", []))
        self.backend = self._configured_backend(tokenizer)

    def _configured_backend(self, tok):
        """A copy of ``tok``'s Rust tokenizer with the wrapper's truncation and padding set once, or None when the
        wrapper's output cannot be reproduced from it."""
        backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
        if backend is None or tok.pad_token_id is None or not set(self.names) <= set(_FIELDS):
            return None
        backend = copy.deepcopy(backend)  # the wrapper re-sets its own on every call
        backend.enable_truncation(self.max_length, strategy="longest_first", direction=tok.truncation_side)
        backend.enable_padding(
            direction=tok.padding_side,
            pad_id=tok.pad_token_id,
            pad_type_id=tok.pad_token_type_id,
            pad_token=tok.pad_token,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        return backend

    @property
    def direct(self) -> bool:
        """True when batches go to the Rust tokenizer directly."""
        return self.backend is not None

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        if self.backend is None or not texts:
            return self._through_wrapper(texts)
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)  # _fast: no char offsets
        encodings = encode(texts)
        out = {}
        for name in self.names:
            rows = np.array([getattr(e, _FIELDS[name]) for e in encodings], dtype=np.int64)
            if rows.shape[1] > self.max_length:  # padding past max_length: only pad columns, on the padding side
                rows = (
                    rows[:, -self.max_length :] if self.tokenizer.padding_side == "left" else rows[:, : self.max_length]
                )
            out[name] = torch.from_numpy(np.ascontiguousarray(rows))
        return out

    def _through_wrapper(self, texts: list[str]) -> dict[str, torch.Tensor]:
        multiple = self.pad_to_multiple_of
        if multiple and self.max_length % multiple:
            multiple = None
        return dict(
            self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                pad_to_multiple_of=multiple,
                return_tensors="pt",
            )
        )
