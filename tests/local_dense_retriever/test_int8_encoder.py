"""The int8 query encoder (``--encoder_dtype int8``, for CPUs without bf16 matmuls): it retrieves what float32
retrieves, a query's vector does not depend on its batch-mates, it is refused with a reason where it cannot run, and
the real server serves with it."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.corpus_store import CorpusStore
from local_dense_retriever.cpu_features import slow_precision
from local_dense_retriever.encoder import HFEncoder, encoder_for
from local_dense_retriever.engine import RetrievalEngine
from local_dense_retriever.errors import EncoderError
from local_dense_retriever.index.base import DenseSearch
from local_dense_retriever.index.torch_flat import TorchFlatIndex
from local_dense_retriever.int8_calibration import InputRanges, check_int8_runs
from local_dense_retriever.int8_linear import Int8FeedForward, Int8Linear, Int8SelfOutput


@pytest.fixture(scope="module")
def int8_encoder(minilm_path) -> HFEncoder:
    return HFEncoder(minilm_path, retriever_name="minilm", device="cpu", dtype="int8", shape_multiple=8)


@pytest.fixture(scope="module")
def questions(toy_questions) -> list[str]:
    return [q["question"] for q in toy_questions]


def top3(encoder, index, questions) -> np.ndarray:
    return index.search(encoder.encode(questions), 3)[1]


def test_int8_runs_every_linear_layer_of_the_packed_encoder_in_int8(int8_encoder):
    assert int8_encoder.precision == "int8"
    for qkv, attention_out, feed_forward in int8_encoder.packed.layers:
        assert isinstance(qkv, Int8Linear) and qkv.weight_t.dtype == torch.int8
        assert isinstance(attention_out, Int8SelfOutput) and isinstance(feed_forward, Int8FeedForward)
        for linear in (qkv, attention_out.dense, feed_forward.up, feed_forward.down):  # smoothed by the calibration
            assert linear.input_scale is not None and linear.input_scale.shape == (linear.in_features,)
    index = TorchFlatIndex(torch.randn(10, 384), device=torch.device("cpu"))
    assert "(int8 on cpu)" in DenseSearch(int8_encoder, index).describe()


def mapped_from(path: Path, tensors) -> int:
    """How many of ``tensors`` lie in memory this process maps from the file ``path``."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) > 5 and Path(fields[5]) == path:
                start, stop = (int(a, 16) for a in fields[0].split("-"))
                spans.append((start, stop))
    return sum(any(start <= t.data_ptr() < stop for start, stop in spans) for t in tensors)


def test_int8_keeps_no_float32_copy_of_what_it_replaced(int8_encoder, minilm_encoder, minilm_path):
    """The float32 layers the int8 ones replace are dropped, and the rest is copied out of the model file's memory
    map, so the file is no longer held in the process's memory for it."""
    assert int8_encoder.weight_bytes() < 0.7 * minilm_encoder.weight_bytes()
    weights = minilm_path.resolve() / "model.safetensors"
    if not mapped_from(weights, minilm_encoder.model.parameters()):
        pytest.skip("transformers read the float32 weights into memory instead of mapping the file")
    held = [t for layer in int8_encoder.packed.layers for part in layer for t in part.parameters()]
    assert mapped_from(weights, [*int8_encoder.model.parameters(), *held]) == 0
    assert int8_encoder.encode(["who wrote the novel the old man and the sea"]).shape == (1, 384)


def test_int8_vectors_and_rankings_are_float32s(int8_encoder, minilm_encoder, minilm_index, questions, toy_questions,
                                                toy_dataset):  # fmt: skip
    """The vectors agree to within the two roundings, the top passage is float32's for nearly every question, and
    recall@3 of the toy QA set is unchanged (the few top-3 changes are near-ties swapped)."""
    index = TorchFlatIndex.from_file(minilm_index["npy"], device=torch.device("cpu"))
    cosine = (int8_encoder.encode(questions) * minilm_encoder.encode(questions)).sum(1)
    assert cosine.min() > 0.99, cosine.min()
    ranked = {"float32": top3(minilm_encoder, index, questions), "int8": top3(int8_encoder, index, questions)}
    assert (ranked["float32"][:, 0] == ranked["int8"][:, 0]).mean() >= 0.9
    overlap = np.mean([len(set(a) & set(b)) / 3 for a, b in zip(ranked["float32"], ranked["int8"], strict=True)])
    assert overlap >= 0.9, overlap
    corpus = CorpusStore(toy_dataset.corpus_path, progress=False)
    single_hop = [q for q in toy_questions if q["metadata"]["hops"] == 1]
    recall = {}
    for name, encoder in (("float32", minilm_encoder), ("int8", int8_encoder)):
        hits = RetrievalEngine(DenseSearch(encoder, index), corpus).search([q["question"] for q in single_hop], 3)
        found = [set(q["metadata"]["supporting_ids"]) <= {d["id"] for d, _ in per_q}
                 for q, per_q in zip(single_hop, hits, strict=True)]  # fmt: skip
        recall[name] = np.mean(found)
    assert recall["int8"] >= recall["float32"] - 0.02, recall


def test_a_querys_int8_vector_does_not_depend_on_its_batch(int8_encoder, questions):
    """One scale per token, not per batch: most questions encode alike alone and among 71 others of any length; the
    rest move only where float noise (the attention's, which sees the batch's padded length) flips an int8 rounding:
    1 - cosine up to 6.5e-4 over 512 toy questions (benchmarks/encoder_int8.py); one scale per batch moved vectors by
    up to 5e-2."""
    texts = (questions * (70 // len(questions) + 1))[:70] + ["x", "a much longer query " * 20]
    together = int8_encoder.encode(texts)
    alone = torch.cat([int8_encoder.encode([t]) for t in texts])
    drift = 1 - torch.nn.functional.cosine_similarity(together, alone, dim=-1)
    assert drift.max() < 2e-3, drift.max()
    assert ((together - alone).abs().amax(1) < 1e-6).float().mean() >= 0.75
    torch.testing.assert_close(together.norm(dim=-1), torch.ones(72))


def test_int8_with_an_activation_the_fused_block_lacks_runs_the_models_own(minilm_path, tmp_path):
    """A BERT whose hidden_act is not a GELU keeps its own feed-forward modules, with int8 linear layers in them."""
    model = tmp_path / "relu-minilm"
    shutil.copytree(minilm_path, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    float32 = HFEncoder(model, retriever_name="minilm", device="cpu", dtype="float32")
    int8 = HFEncoder(model, retriever_name="minilm", device="cpu", dtype="int8")
    assert not any(isinstance(ff, Int8FeedForward) for _, _, ff in int8.packed.layers)
    assert isinstance(int8.packed.layers[0][2].intermediate.dense, Int8Linear)
    texts = ["who founded the city on the river", "x", "when was the bridge built " * 5]
    assert ((int8.encode(texts) * float32.encode(texts)).sum(1) > 0.99).all()


def test_int8_needs_the_packed_encoder(minilm_path):
    with pytest.raises(EncoderError, match="int8 needs the packed encoder.*turned off"):
        HFEncoder(minilm_path, device="cpu", dtype="int8", packed=False)


def test_int8_on_a_gpu_is_refused_before_the_model_loads(minilm_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(EncoderError, match="int8 runs on a CPU only"):
        HFEncoder(minilm_path, device="cuda", dtype="int8")


@pytest.mark.skipif(not torch.cpu._is_vnni_supported(), reason="oneDNN runs torch's int8 matmuls only with VNNI")
def test_where_8_bit_weights_saturate_the_int8_sums_7_bit_weights_keep_them_exact(minilm_path):
    """oneDNN held to AVX2 on a CPU with VNNI adds pairs of int8 products in 16 bits: with full-range weights the sums
    saturate (the encoder gave NaN vectors), with weights within +-64 they stay exact. Found by the CPU's own
    arithmetic, not by its flags; the encoder then runs with 7-bit weights, close to float32. (A CPU without VNNI
    never takes oneDNN's path there: torch's own loop is exact, and slow, ``cpu_features.matmul_slowdown``.)"""
    code = (
        "from local_dense_retriever.cpu_features import int8_matmul_exact\n"
        "assert not int8_matmul_exact() and int8_matmul_exact(63)\n"
        "from local_dense_retriever.encoder import HFEncoder\n"
        f"int8 = HFEncoder({str(minilm_path)!r}, device='cpu', dtype='int8')\n"
        f"float32 = HFEncoder({str(minilm_path)!r}, device='cpu', dtype='float32')\n"
        "texts = ['who founded the city on the river', 'x', 'when was the bridge built ' * 5]\n"
        "assert int8.int8_weight_levels == 63 and int8.packed.layers[0][0].weight_t.abs().max() <= 63\n"
        "assert ((int8.encode(texts) * float32.encode(texts)).sum(1) > 0.99).all()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


def test_int8_where_even_7_bit_weights_saturate_is_refused(minilm_path, monkeypatch):
    from local_dense_retriever import encoder

    monkeypatch.setattr(encoder, "exact_int8_levels", lambda: None)
    with pytest.raises(EncoderError, match="saturate even with 7-bit weights.*--encoder_dtype float32"):
        HFEncoder(minilm_path, device="cpu", dtype="int8")


def test_int8_layers_that_cannot_compile_are_a_clear_error():
    def no_compiler():
        raise RuntimeError("\nCppCompileError: C++ compile error: g++: not found\nmore lines")

    with pytest.raises(EncoderError, match=r"CppCompileError.*C\+\+ compiler.*--encoder_dtype float32") as e:
        check_int8_runs(no_compiler)
    assert "more lines" not in str(e.value)


@pytest.fixture
def vnni_without_bf16(monkeypatch):
    """oneDNN held to AVX512-VNNI, in this process and the servers it starts: a Cascade Lake or Ice Lake to every
    choice the server makes (VNNI, no bf16 matmuls, exact 8-bit int8 sums)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("oneDNN's ISA cap is x86's")
    from local_dense_retriever.cpu_features import FULL_LEVELS, cpu_has_vnni, exact_int8_levels

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    if not cpu_has_vnni() or exact_int8_levels() != FULL_LEVELS:
        pytest.skip("this CPU has no VNNI")


def test_auto_makes_the_query_encoder_int8_where_the_cpu_has_vnni_and_no_bf16(minilm_path, vnni_without_bf16, caplog):
    """There the float32 encoder bounds the batched server (int8: 11.1x the per-request mode, float32 8.5x); the index
    builder's 'auto' stays float, and --no_fp16 (or a named precision) is kept."""
    config = ServerConfig(retriever_name="minilm", retriever_model=str(minilm_path), device="cpu")
    with caplog.at_level("INFO", logger="local_dense_retriever"):
        assert encoder_for(config).precision == "int8"
    assert "query encoder: int8 under 'auto' (this CPU has VNNI and no bf16 matmuls)" in caplog.text
    assert encoder_for(config, queries=False).precision == "float32"  # build_index.py: passages never in int8
    assert encoder_for(config.model_copy(update={"fp16": False})).precision == "float32"
    assert encoder_for(config.model_copy(update={"encoder_dtype": "float32"})).precision == "float32"


@pytest.mark.parametrize("cpu", ["vnni_without_bf16", "vnni_and_bf16_without_amx"])
def test_auto_falls_back_to_float_where_the_int8_layers_cannot_run(minilm_path, request, caplog, cpu):
    request.getfixturevalue(cpu)
    config = ServerConfig(retriever_name="minilm", retriever_model=str(minilm_path), device="cpu", encoder_packed=False)
    with caplog.at_level("WARNING", logger="local_dense_retriever"):
        assert encoder_for(config).precision in ("float32", "bfloat16")
    assert "int8 cannot run here, so 'auto' decides among the float precisions" in caplog.text
    assert "int8 needs the packed encoder" in caplog.text


@pytest.fixture
def vnni_and_bf16_without_amx(monkeypatch, tmp_path):
    """oneDNN held to AVX512-BF16 (an AMD Zen 4 or a Cooper Lake to every choice: bf16 matmuls and VNNI, no AMX), and
    the precision probes' cache in a fresh folder."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("oneDNN's ISA cap is x86's")
    from local_dense_retriever.cpu_features import FULL_LEVELS, cpu_has_vnni, exact_int8_levels
    from local_dense_retriever.encoder_precision import cpu_bf16_flags

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path / "cache"))
    if cpu_bf16_flags() != ["avx512_bf16"] or not cpu_has_vnni() or exact_int8_levels() != FULL_LEVELS:
        pytest.skip("this CPU has no AVX512-BF16 or no VNNI")


def test_the_timed_encoders_take_turns_after_a_warm_up_each():
    """A machine that slows down during the first-start timing must slow both sides alike: the runs alternate, and
    each one's first pass (its warm-up) is not counted."""
    from local_dense_retriever.encoder_precision import best_seconds

    calls = []
    timings = best_seconds({"int8": lambda: calls.append("int8"), "auto": lambda: calls.append("auto")}, repeats=3)
    assert calls == ["int8", "auto"] * 4
    assert list(timings) == ["int8", "auto"] and all(0 <= t < float("inf") for t in timings.values())


@pytest.mark.parametrize("int8_faster", [True, False], ids=["int8-faster", "float-faster"])
def test_with_bf16_but_no_amx_auto_times_int8_against_the_float_choice_once(
    minilm_path, vnni_and_bf16_without_amx, monkeypatch, caplog, int8_faster
):
    """Whether int8 beats bf16 there depends on the CPU, so 'auto' measures it at the first start (the served encode
    of a 64-query batch), keeps int8 only from 1.10x faster, and the next start builds only the one it kept."""
    from local_dense_retriever import encoder_precision

    timed = []

    def seconds(encoders):  # the timings this test's CPU "measures"
        timed.extend(e.precision for e in encoders.values())
        return {name: 0.050 if (e.precision == "int8") == int8_faster else 0.100 for name, e in encoders.items()}

    monkeypatch.setattr(encoder_precision, "seconds_per_probe_batch", seconds)
    config = ServerConfig(retriever_name="minilm", retriever_model=str(minilm_path), device="cpu")
    with caplog.at_level("INFO", logger="local_dense_retriever"):
        first = encoder_for(config)
    int8, floating = timed  # both timed, the float one as 'auto' chose it (its own bf16 probe)
    assert int8 == "int8" and floating in ("bfloat16", "float32")
    kept = "int8" if int8_faster else floating
    assert first.precision == kept
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("query encoder ")]
    assert line.startswith(f"query encoder {kept}: a 64-query batch took ") and "(avx512_bf16, VNNI, no AMX)" in line
    assert ("int8 is kept from 1.1x" in line) != int8_faster
    built = []
    real_init = HFEncoder.__init__

    def counted_init(self, *args, **kwargs):
        built.append(kwargs["dtype"])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(HFEncoder, "__init__", counted_init)
    timed.clear()
    assert encoder_for(config).precision == kept  # the next start: the measured choice, nothing timed again
    assert timed == [] and built == ["int8" if int8_faster else "auto"]
    built.clear()
    assert encoder_for(config, queries=False).precision != "int8" and built == ["auto"]  # the index builder


@pytest.mark.parametrize("auto_on_vnni", [False, True], ids=["named", "auto-on-a-vnni-cpu"])
def test_the_server_serves_int8_as_float32_ranks(tmp_path, minilm_index, toy_dataset, minilm_path, start_cli_server,
                                                  questions, request, auto_on_vnni):  # fmt: skip
    """``--encoder_dtype int8`` through the published command, or no precision named on a CPU with VNNI and no bf16
    matmuls: the same top passage as a float32 server for nearly every question, asked one at a time and in one
    batch."""
    common = ["--index_path", str(minilm_index["npy"]), "--corpus_path", str(toy_dataset.corpus_path), "--topk", "3",
              "--retriever_name", "minilm", "--retriever_model", str(minilm_path)]  # fmt: skip
    top = {}
    for dtype in ("float32", "int8"):
        if dtype == "int8" and auto_on_vnni:
            request.getfixturevalue("vnni_without_bf16")  # the server inherits the cap
        args = [] if dtype == "int8" and auto_on_vnni else ["--encoder_dtype", dtype]
        if dtype == "int8" and not auto_on_vnni and slow_precision("int8") is not None:
            # a CPU without VNNI (an AMD Zen 3): the server refuses int8 with the reason, it does not serve slowly
            with pytest.raises(AssertionError, match="server exited 1"):
                start_cli_server([*common, *args], tmp_path / "int8.log")
            last = (tmp_path / "int8.log").read_text().strip().splitlines()[-1]
            refused = r"retrieval_server: error: --encoder_dtype int8: an int8 matmul takes \d+x float32's time"
            assert re.match(refused, last), last
            return
        proc, url = start_cli_server([*common, *args], tmp_path / f"{dtype}.log")
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                batch = client.post("/retrieve", json={"queries": questions[:24], "topk": 3}).json()["result"]
                single = [client.post("/retrieve", json={"queries": [q], "topk": 3}).json()["result"][0]
                          for q in questions[:24:4]]  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
        assert [hits[0]["id"] for hits in batch[::4]] == [hits[0]["id"] for hits in single]
        top[dtype] = [hits[0]["id"] for hits in batch]
    assert "encoder precision int8" in (tmp_path / "int8.log").read_text()
    assert np.mean([a == b for a, b in zip(top["float32"], top["int8"], strict=True)]) >= 0.9, top


def test_smoothing_evens_out_an_outlier_column_and_clips_nothing():
    """A token whose one column is 50x the others: unsmoothed, that column sets the int8 step of all the others;
    smoothed by the inputs' ranges, the layer is several times closer to float32, also for inputs 10x beyond the
    calibrated range (rows are still scaled per token)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(384, 256)
    x = torch.randn(64, 384)
    x[:, 7] *= 50
    with InputRanges([linear]) as ranges:
        linear(x)
    plain, smoothed = (
        Int8Linear(linear, compiled=False),
        Int8Linear(linear, compiled=False, smooth=ranges.smooth(linear)),
    )
    for inputs in (x, 10 * x):
        exact = linear(inputs)
        error = {name: ((layer(inputs) - exact).norm() / exact.norm()).item()
                 for name, layer in (("plain", plain), ("smoothed", smoothed))}  # fmt: skip
        assert error["smoothed"] < error["plain"] / 3 and error["smoothed"] < 0.01, error


def _elementwise(x: torch.Tensor) -> torch.Tensor:
    return (x.erf() * x.sin()).exp().sqrt()  # one C++ kernel when compiled, no torch operator (those drop the GIL)


def test_compiled_kernels_let_other_threads_run():
    """While a compiled kernel runs, another Python thread (the server's event loop) runs too: inductor's binding,
    patched, releases the GIL as torch's own operators do (held, it left the other thread a gap of 53 of the call's
    66 ms). The patch knows this torch's binding: an upgrade that changes it fails here, not silently."""
    import threading
    import time

    from torch._inductor.codecache import CppPythonBindingsCodeCache

    from local_dense_retriever.int8_linear import _RELEASED_ENTRY, compile_once, release_gil_in_compiled_kernels

    assert release_gil_in_compiled_kernels()
    assert CppPythonBindingsCodeCache.call_entry_function == _RELEASED_ENTRY
    kernel = compile_once(_elementwise)
    x = torch.rand(16_000_000)  # tens of milliseconds
    with torch.inference_mode():
        torch.testing.assert_close(kernel(x[:1000]), _elementwise(x[:1000]))
        kernel(x)
    for _ in range(3):  # the other thread stamps the time as fast as it can; a held GIL leaves a gap of the call
        stop, stamps = threading.Event(), []

        def stamp(stop=stop, stamps=stamps) -> None:
            while not stop.is_set():
                stamps.append(time.perf_counter())

        other = threading.Thread(target=stamp)
        other.start()
        time.sleep(0.05)
        with torch.inference_mode():
            start = time.perf_counter()
            kernel(x)
            end = time.perf_counter()
        stop.set()
        other.join()
        during = [start] + [t for t in stamps if start < t < end] + [end]
        gap = max(b - a for a, b in zip(during, during[1:], strict=False))
        if gap < (end - start) / 2:
            break
    call_ms = (end - start) * 1e3
    assert gap < (end - start) / 2, f"no other thread ran for {gap * 1e3:.0f} of the call's {call_ms:.0f} ms"


def test_an_int8_encoder_that_disagrees_with_float32_is_refused(minilm_path, monkeypatch):
    """Wrong int8 arithmetic is caught at start-up on the calibration queries, not served: NaN vectors (as a kernel
    cache built for another instruction set gave) or vectors far from float32's (sums that come out zero) are refused
    with the reason."""
    from local_dense_retriever import int8_linear

    for wrong, shown in ((float("nan"), "nan"), (0.0, "0.0000")):
        monkeypatch.setattr(int8_linear, "compile_once", lambda fn, w=wrong: lambda *args: fn(*args) * w)
        with pytest.raises(
            EncoderError, match=f"disagrees with float32 on its calibration queries .worst cosine {shown}"
        ):
            HFEncoder(minilm_path, device="cpu", dtype="int8")
