"""A BERT-family encoder run on a batch's real tokens only: the padding is never multiplied through its layers.

A batch of queries is padded to its longest one, and on a CPU the padded positions cost the same matmuls as the real
ones: 64 toy questions (11-21 tokens) were 22% padding in length-sorted sub-batches of 32, 33% in one batch of 64
(``benchmarks/packed_encoder.py``). Here the projections, the output layers and the feed-forward layers run on the
real tokens packed into one ``(tokens, hidden)`` matrix; only the attention (a small share of the work at query
lengths) sees the padded ``(batch, heads, length, length)`` layout, scattered into and gathered out of. The layers'
own modules compute everything but the attention, so their activation, LayerNorm and weights are the model's.

Invariant: ``PackedEncoder(model)(input_ids=..., attention_mask=..., token_type_ids=...)`` returns the model's
``last_hidden_state`` at every position whose mask is 1, to float rounding, and zeros elsewhere. Models it does not
reproduce are refused by :func:`unsupported_reason` (the encoder then runs the model as it is).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Hugging Face model types whose encoder layers this reproduces (absolute positions, bidirectional self-attention)
MODEL_TYPES = ("bert", "roberta", "xlm-roberta")


def unsupported_reason(model) -> str | None:
    """Why ``model`` cannot run packed, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(MODEL_TYPES)}"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder or cross-attention model"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"{config.position_embedding_type} position embeddings"
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if getattr(model, "embeddings", None) is None or not layers:
        return "no embeddings or encoder layers where a BertModel has them"
    for layer in layers:
        attention = getattr(layer, "attention", None)
        parts = (getattr(attention, "self", None), getattr(attention, "output", None))
        if None in parts or not all(hasattr(layer, name) for name in ("intermediate", "output")):
            return f"a layer shaped unlike BERT's ({type(layer).__name__})"
        if not all(isinstance(getattr(parts[0], n, None), torch.nn.Linear) for n in ("query", "key", "value")):
            return f"self-attention without query/key/value projections ({type(parts[0]).__name__})"
    return None


def token_rows(tokens: int, multiple: int) -> int:
    """Rows of the packed matrix for ``tokens`` real tokens: rounded up to a multiple of ``multiple`` or of an eighth
    of the enclosing power of two, whichever is larger (at most 12.5% extra rows), so that the matmuls see about 8
    shapes per doubling of the batch's tokens (oneDNN compiles and caches a kernel per shape); ``multiple`` 1: exact."""
    if multiple <= 1:
        return tokens
    step = max(multiple, 1 << max(tokens.bit_length() - 4, 0))
    return -(-tokens // step) * step


def fused_qkv(attention) -> torch.nn.Linear:
    """One Linear computing a self-attention's query, key and value projections side by side (one matmul). The three
    projections' weights and biases become views of its own, so the model keeps one copy of them, not two, and its own
    forward still computes the same (the model must not change dtype or device afterwards: that would copy them)."""
    parts = (attention.query, attention.key, attention.value)
    first = parts[0].weight
    fused = torch.nn.Linear(first.shape[1], 3 * first.shape[0], device=first.device, dtype=first.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        fused.bias.copy_(torch.cat([p.bias for p in parts]))
    fused.requires_grad_(False)
    for name in ("weight", "bias"):
        for part, view in zip(parts, getattr(fused, name).split(first.shape[0]), strict=True):
            setattr(part, name, torch.nn.Parameter(view, requires_grad=False))
    return fused


class FeedForward(torch.nn.Module):
    """A BERT layer's feed-forward block, ``x`` → ``output(intermediate(x), x)``, with the layer's own modules."""

    def __init__(self, intermediate: torch.nn.Module, output: torch.nn.Module) -> None:
        super().__init__()
        self.intermediate, self.output = intermediate, output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(x), x)


class PackedEncoder:
    """``model``'s forward pass over real tokens only. Build it after the model has its final device and dtype."""

    def __init__(self, model, *, token_multiple: int = 1) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"cannot run this model packed: {reason}")
        self.model = model
        self.token_multiple = token_multiple
        self.heads = int(model.config.num_attention_heads)
        self.layers = []
        for layer in model.encoder.layer:
            own = layer.attention.self
            self.layers.append((fused_qkv(own), layer.attention.output, FeedForward(layer.intermediate, layer.output)))

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``last_hidden_state`` of the batch, shape ``(batch, length, hidden)``, zeros at padded positions."""
        batch, length = input_ids.shape
        mask = attention_mask.bool()
        real = mask.reshape(-1).nonzero().squeeze(1)  # padded position of each real token, row-major
        tokens = real.numel()
        if not tokens:  # nothing but padding (no tokenizer makes such a batch; kept to the invariant)
            return self.model.embeddings.word_embeddings.weight.new_zeros(batch, length, self.model.config.hidden_size)
        rows = token_rows(tokens, self.token_multiple)
        gather = torch.cat([real, real[:1].expand(rows - tokens)]) if rows > tokens else real  # extra rows: copies
        embedded = self.model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        hidden = embedded.reshape(batch * length, -1)
        width = hidden.shape[1]
        x = hidden.index_select(0, gather)
        key_mask = mask[:, None, None, :]
        padded = x.new_zeros(batch * length, 3 * width)  # padding positions stay 0: masked keys, unused queries
        for qkv, attention_out, feed_forward in self.layers:
            padded.index_copy_(0, real, qkv(x)[:tokens])
            q, k, v = padded.view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # scale 1/sqrt(head size)
            attended = attended.transpose(1, 2).reshape(batch * length, width).index_select(0, gather)
            x = attention_out(attended, x)  # dense, residual, LayerNorm: the layer's own modules
            x = feed_forward(x)
        result = x.new_zeros(batch * length, width)
        result.index_copy_(0, real, x[:tokens])
        return result.view(batch, length, width)


def token_groups(sorted_lengths: list[int], budget: int) -> list[int]:
    """Where each pass over rows sorted by length ends: consecutive rows whose tokens add up to at most ``budget``
    (a longer row alone); passes of ~10,000 tokens ran 15-27% slower than ~2,000 (``benchmarks/packed_encoder.py``)."""
    ends: list[int] = []
    total = 0
    for i, n in enumerate(sorted_lengths):
        if total and total + n > budget:
            ends.append(i)
            total = 0
        total += n
    if sorted_lengths:
        ends.append(len(sorted_lengths))
    return ends
