"""Pre-training on another toy world: the repeated-span task scores only what can be copied, the pre-trained model is
written complete to its own folder, and bad inputs are refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_bench.train.config import PretrainSettings
from cpu_bench.train.initial_model import corpus_texts
from cpu_bench.train.pretrain import BatchShapes, pretrain, repeated_span_batch
from local_dense_retriever.toy.corpus import generate_toy_dataset

STEPS = PretrainSettings(copy_steps=3, lm_steps=2)
SMALL = BatchShapes(copy_batch_size=4, batch_size=2, seq_len=32, warmup_steps=1)


@pytest.fixture(scope="module")
def other_world_texts(tmp_path_factory):
    dataset = generate_toy_dataset(tmp_path_factory.mktemp("world1"), num_passages=60, seed=1, num_questions=0)
    return corpus_texts(dataset.corpus_path)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from cpu_bench.train.tiny_model import TinyModelSpec, write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(layers=1, hidden=32, intermediate=64))


def test_the_repeated_span_task_scores_only_the_second_occurrence():
    stream = torch.arange(1000, 2000)
    pieces = torch.arange(10)  # every run is made of pieces the stream never contains
    spec = BatchShapes(copy_batch_size=64)
    ids, labels = repeated_span_batch(stream, pieces, spec, np.random.default_rng(0))
    assert ids.shape == labels.shape == (64, spec.copy_seq_len)
    for row_ids, row_labels in zip(ids, labels, strict=True):
        run = row_ids[row_ids < 10].tolist()
        half = len(run) // 2
        assert len(run) % 2 == 0 and run[:half] == run[half:]  # the same run, twice
        low, high = spec.copy_span
        assert low <= half < high
        scored = row_labels[row_labels != -100].tolist()
        assert scored == run[half + 1 :]  # the second run, after its first piece: only what copying predicts


def test_pretraining_writes_a_complete_model_and_leaves_the_initial_one(tiny_model, other_world_texts, tmp_path):
    from safetensors.torch import load_file

    before = load_file(tiny_model / "model.safetensors")
    out = tmp_path / "base"
    stats = pretrain(tiny_model, out, other_world_texts, STEPS, SMALL)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    after = load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # trained
    assert all(torch.equal(before[k], load_file(tiny_model / "model.safetensors")[k]) for k in before)  # untouched
    assert stats["tokens"] > 0 and np.isfinite(stats["last_loss"])


def test_pretraining_is_reproducible(tiny_model, other_world_texts, tmp_path):
    from safetensors.torch import load_file

    pretrain(tiny_model, tmp_path / "a", other_world_texts, STEPS, SMALL)
    pretrain(tiny_model, tmp_path / "b", other_world_texts, STEPS, SMALL)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_too_little_text_is_refused_and_nothing_is_written(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="fewer than one window"):
        pretrain(tiny_model, tmp_path / "base", ["a short passage"], STEPS, SMALL)
    assert not (tmp_path / "base").exists()


def test_a_window_too_short_for_two_runs_is_refused(tiny_model, other_world_texts, tmp_path):
    spec = BatchShapes(copy_seq_len=12, copy_span=(4, 10))
    with pytest.raises(ValueError, match="cannot hold two runs"):
        pretrain(tiny_model, tmp_path / "base", other_world_texts, PretrainSettings(copy_steps=1), spec)
    assert not (tmp_path / "base").exists()


def _rows(model_dir, n: int = 6) -> list[tuple[list[int], list[int]]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = []
    for i in range(n):
        prompt = tokenizer.encode(f"Question: where was person {i} born?", add_special_tokens=False)
        answer = tokenizer.encode(f" <answer> city {i} </answer>", add_special_tokens=False)
        rows.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return rows


def test_masked_loss_counts_only_the_trained_tokens(tiny_model):
    from transformers import Qwen2ForCausalLM

    from cpu_bench.train.pretrain import masked_loss, padded

    model = Qwen2ForCausalLM.from_pretrained(tiny_model)
    ids, mask = [5, 6, 7, 8, 9], [0, 0, 1, 1, 1]
    with torch.no_grad():
        log_probs = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        expected = -sum(log_probs[i - 1, ids[i]] for i in range(len(ids)) if mask[i]) / sum(mask)
        assert torch.isclose(masked_loss(model, *padded([(ids, mask)], pad_id=0)), expected, atol=1e-5)
        # a shorter, padded row whose tokens are all masked changes nothing
        two = padded([(ids, mask), ([3, 4], [0, 0])], pad_id=0)
        assert two[2][1].tolist() == [1, 1, 0, 0, 0]
        assert torch.isclose(masked_loss(model, *two), expected, atol=1e-5)


def test_trajectory_pretraining_lowers_the_loss_and_writes_a_model(tiny_model, tmp_path):
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from cpu_bench.train.pretrain import masked_loss, padded, train_on_trajectories

    # the tiny model's own tokenizer: rows must be in its vocabulary
    rows = _rows(tiny_model)
    pad = AutoTokenizer.from_pretrained(tiny_model).pad_token_id
    stats = train_on_trajectories(
        tiny_model,
        tmp_path / "base",
        rows,
        PretrainSettings(task_steps=30),
        BatchShapes(task_batch_size=3, warmup_steps=1),
    )
    with torch.no_grad():
        before = masked_loss(Qwen2ForCausalLM.from_pretrained(tiny_model), *padded(rows, pad))
        after = masked_loss(Qwen2ForCausalLM.from_pretrained(tmp_path / "base"), *padded(rows, pad))
    assert after < before and stats["rows"] == len(rows)


def test_trajectory_pretraining_refuses_rows_without_a_trained_token(tiny_model, tmp_path):
    from cpu_bench.train.pretrain import train_on_trajectories

    with pytest.raises(ValueError, match="no trajectory with a trained token"):
        train_on_trajectories(tiny_model, tmp_path / "base", [([1, 2, 3], [0, 0, 0])], PretrainSettings(task_steps=1))
    assert not (tmp_path / "base").exists()
