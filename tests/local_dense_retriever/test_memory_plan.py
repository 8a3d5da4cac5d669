"""The memory plan the server logs before it loads: each device's share of the index in the precision it is held in,
the search's working memory and the encoder, for wiki-18's shape over 1, 2 and 8 GPUs and on the CPU, and the plan of
real files on this machine."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.memory_plan import (
    Device,
    EncoderSize,
    IndexLayout,
    make_plan,
    plan_lines,
    plan_memory,
    weight_bytes,
)

H100 = 81_559 << 20  # what an H100 80GB reports
WIKI_ROWS, DIM = 21_015_324, 768
E5_BASE = 109_482_240  # e5-base-v2's parameters
BATCH = 256


def gpu_plan(gpus: int, encoder_on: str = "cuda:0") -> list[str]:
    """wiki-18 in float16 sharded over ``gpus`` fake H100s, as the torch backend holds it."""
    devices = [Device(f"cuda:{i}", H100) for i in range(gpus)]
    score_buffer = min(1 << 30, BATCH * -(-WIKI_ROWS // gpus) * 2)
    layout = IndexLayout(WIKI_ROWS, DIM, "float16", WIKI_ROWS * DIM * 2, scratch_bytes=score_buffer)
    where = next((d for d in devices if d.name == encoder_on), Device(encoder_on, 256 << 30))
    encoder = EncoderSize(
        where, E5_BASE * (2 if encoder_on != "cpu" else 4), "float16" if encoder_on != "cpu" else "float32"
    )
    return plan_lines(plan_memory(layout, devices, encoder), layout, "e5_Flat.index")


HEAD = "memory plan: e5_Flat.index, 21,015,324 x 768 in float16 over {} (plus each GPU's CUDA context and the models' "
HEAD += "activations)"
ENCODER = " + encoder 209 MiB (float16)"  # e5-base-v2 in float16


def test_one_gpu_holds_the_whole_index():
    assert gpu_plan(1) == [
        HEAD.format("1 GPU"),
        "memory plan: cuda:0: 31.3 GiB of 79.6 GiB (39%): index 30.1 GiB + score buffer 1.0 GiB" + ENCODER,
    ]


def test_two_gpus_hold_half_each_and_the_encoder_on_the_first():
    assert gpu_plan(2) == [
        HEAD.format("2 GPUs"),
        "memory plan: cuda:0: 16.2 GiB of 79.6 GiB (20%): index 15.0 GiB + score buffer 1.0 GiB" + ENCODER,
        "memory plan: cuda:1: 16.0 GiB of 79.6 GiB (20%): index 15.0 GiB + score buffer 1.0 GiB",
    ]


def test_eight_gpus_that_hold_the_same_read_as_one_line():
    assert gpu_plan(8) == [
        HEAD.format("8 GPUs"),
        "memory plan: cuda:0: 5.0 GiB of 79.6 GiB (6%): index 3.8 GiB + score buffer 1.0 GiB" + ENCODER,
        "memory plan: cuda:1-7: 4.8 GiB each of 79.6 GiB (6%): index 3.8 GiB + score buffer 1.0 GiB",
    ]
    # with the encoder on the CPU every GPU holds the same: one line for all, the encoder's on its own
    assert gpu_plan(8, encoder_on="cpu")[1:] == [
        "memory plan: cuda:0-7: 4.8 GiB each of 79.6 GiB (6%): index 3.8 GiB + score buffer 1.0 GiB",
        "memory plan: cpu: 418 MiB of 256.0 GiB RAM (0%): encoder 418 MiB (float32)",
    ]


def test_gpus_not_in_a_run_are_listed_by_number():
    layout = IndexLayout(4, 2, "float16", 16)
    devices = [Device("cuda:1", 1 << 30), Device("cuda:3", 1 << 30)]
    assert plan_lines(plan_memory(layout, devices), layout, "x.index")[1].startswith("memory plan: cuda:1,3: 8 B each")


def test_the_cpu_maps_the_float32_file_and_holds_the_pre_scan_copy():
    cpu = Device("cpu", 256 << 30)
    layout = IndexLayout(WIKI_ROWS, DIM, "float32", WIKI_ROWS * DIM * 4, mapped=True, coarse_dtype="bfloat16")
    assert plan_lines(
        plan_memory(layout, [cpu], EncoderSize(cpu, E5_BASE * 4, "float32")), layout, "e5_Flat.index"
    ) == [
        "memory plan: e5_Flat.index, 21,015,324 x 768 in float32 on the CPU",
        "memory plan: cpu: 30.5 GiB of 256.0 GiB RAM (12%): bfloat16 pre-scan copy 30.1 GiB + encoder 418 MiB "
        "(float32); maps the file's 60.1 GiB of float32 rows (page cache, read as searched)",
    ]
    held = IndexLayout(WIKI_ROWS, DIM, "bfloat16", WIKI_ROWS * DIM * 2)  # converted: held, not mapped
    assert plan_lines(plan_memory(held, [cpu], EncoderSize(cpu, None, "float32")), held, "e5_Flat.index")[1] == (
        "memory plan: cpu: 30.1 GiB of 256.0 GiB RAM (12%): index 30.1 GiB + encoder of unknown size (float32)"
    )


def test_weight_bytes_counts_the_models_float_tensors(minilm_path, minilm_encoder):
    model = minilm_encoder.model
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    counted = weight_bytes(str(minilm_path), "float32")
    assert held <= counted <= 1.01 * held  # the file also holds a pooler the encoder does not load
    assert weight_bytes(str(minilm_path), "float16") * 2 == counted
    assert weight_bytes("no-such-org/no-such-model", "float16") is None  # not downloaded: unknown, not a guess


@pytest.fixture(scope="module")
def flat_file(tmp_path_factory):
    index = faiss.IndexFlatIP(384)
    index.add(np.random.default_rng(0).standard_normal((1_000, 384)).astype(np.float32))
    path = tmp_path_factory.mktemp("plan") / "flat.index"
    faiss.write_index(index, str(path))
    return path


def test_plan_of_a_real_file_on_this_cpu(flat_file, minilm_path):
    common = {"index_path": flat_file, "corpus_path": flat_file, "retriever_model": str(minilm_path), "device": "cpu"}
    mapped = make_plan(ServerConfig(**common, index_prefilter="off", encoder_dtype="float32"), "torch").lines()
    assert mapped[0] == "memory plan: flat.index, 1,000 x 384 in float32 on the CPU"
    assert "encoder 87 MiB (float32); maps the file's 1.5 MiB of float32 rows" in mapped[1]
    converted = make_plan(ServerConfig(**common, index_dtype="bfloat16", encoder_dtype="float32"), "torch").lines()
    assert ": index 750 KiB + encoder 87 MiB (float32)" in converted[1] and "maps" not in converted[1]
    read = make_plan(ServerConfig(**common, backend="faiss", encoder_dtype="float32"), "faiss").lines()
    assert read[0] == "memory plan: flat.index, 1,000 x 384 in float32 on the CPU"
    assert ": index 1.5 MiB + encoder 87 MiB (float32)" in read[1]


def test_a_reranker_is_planned_beside_the_encoder_on_its_device(flat_file, minilm_path):
    common = {"index_path": flat_file, "corpus_path": flat_file, "retriever_model": str(minilm_path), "device": "cpu"}
    config = ServerConfig(**common, index_dtype="bfloat16", encoder_dtype="float32", reranker_model=str(minilm_path))
    lines = make_plan(config, "torch").lines()
    assert ": index 750 KiB + encoder 87 MiB (float32) + reranker 87 MiB (float32)" in lines[1]
    devices = [Device("cuda:0", H100), Device("cuda:1", H100)]
    layout = IndexLayout(WIKI_ROWS, DIM, "float16", WIKI_ROWS * DIM * 2)
    reranker = EncoderSize(devices[0], 560_000_000 * 2, "float16", "reranker")  # a bge-reranker-large in float16
    lines = plan_lines(plan_memory(layout, devices, EncoderSize(devices[0], E5_BASE * 2, "float16"), reranker),
                       layout, "e5_Flat.index")  # fmt: skip
    assert lines[1] == (
        "memory plan: cuda:0: 16.3 GiB of 79.6 GiB (20%): index 15.0 GiB + encoder 209 MiB (float16) + reranker "
        "1.0 GiB (float16)"
    )
    assert lines[2] == "memory plan: cuda:1: 15.0 GiB of 79.6 GiB (19%): index 15.0 GiB"
