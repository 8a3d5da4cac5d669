"""BatchTokenizer: the Hugging Face wrapper's tensors, from the Rust tokenizer directly, for every batch the encoder
sends (prefixes, padding rows, long and odd texts), and the wrapper itself where that cannot be reproduced."""

from __future__ import annotations

import copy

import pytest
import torch

from local_dense_retriever.batch_tokenizer import BatchTokenizer

BATCHES = [
    ["query: who founded the Graimdemmam Guild?"],
    ["a", "query: in which city was Krobam Basbranpel born?", "", "", ""],  # the encoder's padding rows are ""
    ["   ", "\t\n", "Ünïcödé ünd àccents — «quotes» 東京 🙂", "x" * 3000, "word " * 400],  # blank, odd, over max_length
    [f"passage: question number {i} " + "longer " * (i % 37) for i in range(130)],
]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


def wrapper(tok, texts, max_length, multiple):
    out = tok(texts, padding=True, truncation=True, max_length=max_length, pad_to_multiple_of=multiple,
              return_tensors="pt")  # fmt: skip
    return dict(out)


@pytest.mark.parametrize(("max_length", "multiple"), [(256, None), (256, 4), (8, None), (12, 4), (512, 8)])
def test_the_same_tensors_as_the_wrapper(tokenizer, max_length, multiple):
    fast = BatchTokenizer(tokenizer, max_length, multiple)
    assert fast.direct
    for texts in BATCHES:
        got, want = fast(texts), wrapper(tokenizer, texts, max_length, multiple)
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == torch.int64
            assert torch.equal(got[name], want[name]), (name, texts[:2])


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_max_length_off_the_multiple_pads_up_to_it_and_no_further(tokenizer, side):
    """The wrapper refuses max_length 10 with padding to multiples of 4 (the server's --query_max_length 250 with its
    default --encoder_shape_multiple 4 failed every search that way); here widths are 4, 8, then 10."""
    tok = copy.deepcopy(tokenizer)
    tok.padding_side = tok.truncation_side = side
    with pytest.raises(ValueError, match="not a multiple of pad_to_multiple_of"):
        wrapper(tok, ["a b"], 10, 4)
    fast = BatchTokenizer(tok, 10, 4)
    for texts, width in [(["a"], 4), (["a b c d e f"], 8), (["a b c d e f g h i j k"], 10), (BATCHES[2], 10)]:
        got, plain = fast(texts), wrapper(tok, texts, 10, None)  # plain: padded to the longest only
        assert got["input_ids"].shape == (len(texts), width)
        extra = width - plain["input_ids"].shape[1]
        for name in plain:
            pad = {"input_ids": tok.pad_token_id, "attention_mask": 0, "token_type_ids": 0}[name]
            filler = torch.full((len(texts), extra), pad, dtype=torch.int64)
            parts = [filler, plain[name]] if side == "left" else [plain[name], filler]
            assert torch.equal(got[name], torch.cat(parts, dim=1)), name
    slow = BatchTokenizer(tok, 10, 4)
    slow.backend = None  # the wrapper's path drops the multiple rather than fail
    assert torch.equal(slow(BATCHES[2])["input_ids"], wrapper(tok, BATCHES[2], 10, None)["input_ids"])


def test_left_padding_and_truncation_are_followed(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.padding_side, tok.truncation_side = "left", "left"
    fast = BatchTokenizer(tok, 12, 4)
    for texts in BATCHES:
        got, want = fast(texts), wrapper(tok, texts, 12, 4)
        assert all(torch.equal(got[name], want[name]) for name in want)


def test_the_wrapper_setting_stays_as_the_user_left_it(tokenizer):
    """The direct path configures a copy of the Rust tokenizer, not the one the wrapper (and its users) share."""
    before = (tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding)
    BatchTokenizer(tokenizer, 7, 4)(["one two three four five six seven eight nine"])
    assert (tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding) == before


def test_a_tokenizer_without_a_rust_backend_goes_through_the_wrapper():
    class SlowTokenizer:
        is_fast = False
        calls: list[tuple] = []

        def __call__(self, texts, **kwargs):
            self.calls.append((texts, kwargs))
            return {"input_ids": torch.ones(len(texts), 3, dtype=torch.int64)}

    tok = SlowTokenizer()
    fast = BatchTokenizer(tok, 64, 4)
    assert not fast.direct
    assert fast(["a", "b"])["input_ids"].shape == (2, 3)
    assert tok.calls == [(["a", "b"], {"padding": True, "truncation": True, "max_length": 64,
                                       "pad_to_multiple_of": 4, "return_tensors": "pt"})]  # fmt: skip


def test_the_encoder_accepts_a_max_length_off_its_shape_multiple(minilm_path):
    from local_dense_retriever.encoder import HFEncoder

    enc = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype="float32", max_length=250,
                    shape_multiple=4)  # fmt: skip
    vectors = enc.encode(BATCHES[2] + BATCHES[1])
    assert vectors.shape == (10, 384) and torch.allclose(vectors.norm(dim=1), torch.ones(10))


def test_the_encoder_encodes_as_before(minilm_path):
    """The server's encoder gives the vectors the wrapper's tensors give (padding rows and token padding included)."""
    from local_dense_retriever.encoder import HFEncoder

    enc = HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype="float32", shape_multiple=4)
    assert enc._tokenize.direct
    texts = BATCHES[3][:45] + BATCHES[2]
    direct = enc.encode(texts)
    enc._tokenize.backend = None  # the wrapper's path
    assert torch.equal(enc.encode(texts), direct)
