"""The packed encoder (real tokens only) gives the model's own hidden states, and models it cannot run are refused."""

from __future__ import annotations

import shutil

import pytest
import torch

from local_dense_retriever.packed_encoder import PackedEncoder, token_groups, token_rows, unsupported_reason

TEXTS = [
    "x",
    "Who founded the Vosrerrur Observatory?",
    "Which river flows through the city where Holben Hesnorgul was born?",
    "a much longer query " * 12,
    "In which city was Milvi Samgekes born?",
]


def hidden_states_agree(model, batch: dict, *, token_multiple: int, atol: float) -> None:
    with torch.inference_mode():
        expected = model(**batch).last_hidden_state
        got = PackedEncoder(model, token_multiple=token_multiple)(**batch)
        again = model(**batch).last_hidden_state  # its projections are now views of the fused one's weights
    torch.testing.assert_close(again, expected, atol=0, rtol=0)
    real = batch["attention_mask"].bool()
    assert got.shape == expected.shape
    torch.testing.assert_close(got[real], expected[real], atol=atol, rtol=1e-4)
    assert not got[~real].any(), "padded positions must be zero"


@pytest.mark.parametrize("token_multiple", [1, 4, 64])
def test_packed_minilm_gives_the_models_hidden_states(minilm_path, token_multiple):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    batch = dict(AutoTokenizer.from_pretrained(str(minilm_path))(TEXTS, padding=True, return_tensors="pt"))
    assert not batch["attention_mask"].all(), "the batch must hold padding"
    hidden_states_agree(model, batch, token_multiple=token_multiple, atol=1e-5)


def tiny_config(model_type: str, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type,
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=80,
        pad_token_id=1,
        **extra,
    )


@pytest.mark.parametrize(
    "model_type, extra",
    [("bert", {"hidden_act": "gelu_new", "type_vocab_size": 2}), ("roberta", {}), ("xlm-roberta", {})],
)
def test_packed_family_models_give_their_hidden_states(model_type, extra):
    """BERT with another activation and token types; RoBERTa and XLM-R, whose positions count from the padding id."""
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(model_type, **extra)).eval()
    lengths = [3, 17, 9, 30, 1]
    ids = torch.full((len(lengths), max(lengths)), 1)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, 120, (n,))
        mask[row, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if model_type == "bert":
        batch["token_type_ids"] = (torch.arange(ids.shape[1]) > 4).long().expand_as(ids) * mask
    hidden_states_agree(model, batch, token_multiple=8, atol=1e-5)


@pytest.mark.parametrize(
    "model_type, extra, reason",
    [
        ("distilbert", {}, "model type 'distilbert'"),
        ("bert", {"position_embedding_type": "relative_key"}, "relative_key position embeddings"),
        ("bert", {"is_decoder": True}, "decoder"),
    ],
)
def test_models_it_cannot_reproduce_are_refused(model_type, extra, reason):
    from transformers import AutoModel

    if model_type == "distilbert":
        from transformers import DistilBertConfig

        config = DistilBertConfig(vocab_size=120, dim=32, n_layers=1, n_heads=4, hidden_dim=64)
    else:
        config = tiny_config(model_type, **extra)
    model = AutoModel.from_config(config)
    assert reason in unsupported_reason(model)
    with pytest.raises(ValueError, match="cannot run this model packed"):
        PackedEncoder(model)


def test_packing_keeps_one_copy_of_the_attention_projections(minilm_encoder):
    """The fused query/key/value projection holds the model's own weights, not a second copy of them."""
    from local_dense_retriever.encoder import storage_bytes

    model = minilm_encoder.model
    assert storage_bytes(model.parameters()) == sum(p.nbytes for p in model.parameters())  # no weight shares another's
    assert minilm_encoder.weight_bytes() == storage_bytes([*model.parameters(), *model.buffers()])


def test_the_encoder_runs_an_unsupported_bert_padded(minilm_path, tmp_path):
    """A model the packed path refuses is encoded by the model itself, with the same vectors for the same texts."""
    from transformers import AutoConfig, AutoModel

    from local_dense_retriever.encoder import HFEncoder

    packed = HFEncoder(minilm_path, device="cpu", dtype="float32")
    assert packed.packed is not None
    relative = tmp_path / "minilm-relative"
    shutil.copytree(minilm_path, relative)
    config = AutoConfig.from_pretrained(str(relative))
    config.position_embedding_type = "relative_key"  # the weights stay loadable; the forward is no longer BERT's
    model = AutoModel.from_pretrained(str(minilm_path), config=config)
    model.save_pretrained(str(relative))
    padded = HFEncoder(relative, device="cpu", dtype="float32")
    assert padded.packed is None
    vectors = padded.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), 384)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(len(TEXTS)))
    with torch.inference_mode():
        batch = dict(padded.tokenizer(TEXTS, padding=True, return_tensors="pt"))
        states = padded.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        expected = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    torch.testing.assert_close(vectors, expected, atol=1e-5, rtol=1e-4)


def test_token_rows_bound_the_shapes_and_the_waste():
    assert [token_rows(n, 1) for n in (1, 17, 1000)] == [1, 17, 1000]
    for multiple in (4, 8):
        for n in range(1, 4097):
            rows = token_rows(n, multiple)
            assert n <= rows <= n * 1.125 + multiple and rows % multiple == 0, (n, multiple, rows)
        for low in (256, 512, 1024, 2048):  # about 8 shapes per doubling of the tokens
            assert len({token_rows(n, multiple) for n in range(low, 2 * low)}) <= 9


def test_token_groups_cut_sorted_rows_at_the_budget():
    assert token_groups([], 100) == []
    assert token_groups([10] * 5, 100) == [5]
    assert token_groups([30, 30, 30, 30, 30], 60) == [2, 4, 5]
    assert token_groups([10, 250, 300], 100) == [1, 2, 3]  # a row over the budget goes alone


def test_packed_passes_encode_like_the_padded_model(minilm_path):
    """Many passes of mixed lengths (the token budget cuts a large batch of passages) give the padded model's vectors,
    in the caller's order; an empty batch gives no rows."""
    from local_dense_retriever import encoder as enc_module
    from local_dense_retriever.encoder import HFEncoder

    texts = [TEXTS[i % len(TEXTS)] * (1 + i % 7) for i in range(150)]
    packed = HFEncoder(minilm_path, device="cpu", dtype="float32", shape_multiple=4, max_length=128)
    padded = HFEncoder(minilm_path, device="cpu", dtype="float32", shape_multiple=4, max_length=128)
    padded.packed = None
    lengths = packed.tokenizer(texts, truncation=True, max_length=128, return_length=True)["length"]
    assert sum(lengths) > 3 * enc_module.PACKED_TOKENS, "the batch must take several passes"
    for is_query in (True, False):
        torch.testing.assert_close(
            packed.encode(texts, is_query=is_query), padded.encode(texts, is_query=is_query), atol=1e-5, rtol=1e-4
        )
    assert packed.encode([]).shape == (0, 384)


def test_a_batch_of_padding_only_gives_zeros():
    from transformers import AutoModel

    model = AutoModel.from_config(tiny_config("bert")).eval()
    ids = torch.ones(2, 5, dtype=torch.long)
    out = PackedEncoder(model, token_multiple=4)(input_ids=ids, attention_mask=torch.zeros_like(ids))
    assert out.shape == (2, 5, 32) and not out.any()


def test_no_encoder_packed_runs_the_models_own_forward(minilm_path, tmp_path):
    """The server's and the index builder's flag reaches the encoder they make; packed is the default."""
    from local_dense_retriever.encoder import encoder_for
    from local_dense_retriever.retrieval_server import config_from_args

    base = ["--retriever_model", str(minilm_path), "--encoder_dtype", "float32", "--device", "cpu"]
    on, _ = config_from_args(base)
    off, _ = config_from_args([*base, "--no_encoder_packed"])
    assert (on.encoder_packed, off.encoder_packed) == (True, False)
    packed, padded = encoder_for(on), encoder_for(off)
    assert packed.packed is not None and padded.packed is None
    torch.testing.assert_close(packed.encode(TEXTS), padded.encode(TEXTS), atol=1e-5, rtol=1e-4)
    from local_dense_retriever.artifacts.build_index import parse_args

    corpus = ["--corpus_path", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "i")]
    assert parse_args(corpus).encoder_packed and not parse_args([*corpus, "--no_encoder_packed"]).encoder_packed
