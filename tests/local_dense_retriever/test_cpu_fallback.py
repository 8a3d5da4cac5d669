"""The flat index on GPUs or a compressed one on the CPU: the decision over fake GPUs' shares (fits, does not fit,
with and without a fallback), ``auto``'s choice among the build records beside the flat index, an explicit fallback
of another corpus refused, and load_engine serving the fallback when its plan does not fit."""

from __future__ import annotations

import logging
from pathlib import Path

import faiss
import numpy as np
import pytest

from local_dense_retriever.config import ServerConfig
from local_dense_retriever.cpu_fallback import Fallback, choose, decide, find_fallback, given_fallback, gpu_overflow
from local_dense_retriever.errors import IndexLoadError
from local_dense_retriever.index.build_record import BuildRecord, RecallPoint, write_record
from local_dense_retriever.memory_plan import Device, IndexLayout, Plan, plan_memory

GIB = 1 << 30
H100 = 81_559 << 20
ROWS, DIM = 1_000, 8


def flat_plan(gpus: int, index_gib: float, total: int = H100) -> list:
    """A float16 flat index of ``index_gib`` GiB sharded over ``gpus`` fake GPUs of ``total`` bytes."""
    layout = IndexLayout(ROWS, DIM, "float16", int(index_gib * GIB), scratch_bytes=GIB)
    return plan_memory(layout, [Device(f"cuda:{i}", total) for i in range(gpus)])


def test_a_flat_index_that_fits_under_the_fraction_is_served_as_planned():
    shares = flat_plan(1, 60)  # 61 GiB of 79.6 GiB: 77%
    assert gpu_overflow(shares, 0.9) is None
    assert decide(shares, 0.9, Path("e5_Flat.index"), None, None).warnings == []
    fits = decide(shares, 0.9, Path("e5_Flat.index"), None, "auto")
    assert fits.fallback is None and fits.warnings == []
    assert fits.notes == ["memory plan: the flat index fits under --gpu_memory_fraction 0.9 (at most 77% of a GPU): "
                          "--cpu_index auto is unused"]  # fmt: skip
    cpu = plan_memory(IndexLayout(ROWS, DIM, "float32", 100 * GIB), [Device("cpu", 64 * GIB)])
    assert gpu_overflow(cpu, 0.1) is None  # nothing on a GPU: nothing to fit
    assert decide(cpu, 0.1, Path("e5_Flat.index"), None, "auto").notes[0].endswith("on the CPU: --cpu_index auto is "
                                                                                   "unused")  # fmt: skip


def test_over_the_fraction_without_a_fallback_recommends_building_one():
    shares = flat_plan(2, 140)  # 71 GiB of each 79.6 GiB: 89%
    assert gpu_overflow(shares, 0.9) is None and gpu_overflow(shares, 0.8) is shares[0]
    [warning] = decide(shares, 0.8, Path("/data/e5_Flat.index"), None, None).warnings
    assert warning.startswith("memory plan: the flat index needs 71.0 GiB of cuda:0's 79.6 GiB (89%), over "
                              "--gpu_memory_fraction 0.8: loading it anyway; build a compressed index from the flat "
                              "one with `python local_dense_retriever/build_index.py --from_index /data/e5_Flat.index "
                              "--index_type ivf_sq8 --output /data/e5_Flat_ivf_sq8.index` and serve it on the CPU "
                              "(`GPUS=none INDEX_PATH=/data/e5_Flat_ivf_sq8.index bash "
                              "run_scripts/launch_retriever.sh`)")  # fmt: skip
    [none_found] = decide(shares, 0.8, Path("/data/e5_Flat.index"), None, "auto").warnings
    assert "0.8; --cpu_index auto found no compressed index of e5_Flat.index beside it: loading it anyway" in none_found


def test_over_the_fraction_with_a_fallback_serves_it_on_the_cpu():
    fallback = Fallback(Path("e5_ivf_sq8.index"), None, 0.987, "recall@3 0.987 vs flat at nprobe=32")
    decision = decide(flat_plan(1, 75), 0.9, Path("e5_Flat.index"), fallback, "auto")
    assert decision.fallback is fallback
    assert decision.warnings == ["memory plan: the flat index needs 76.0 GiB of cuda:0's 79.6 GiB (95%), over "
                                 "--gpu_memory_fraction 0.9: serving e5_ivf_sq8.index on the CPU instead with the "
                                 "faiss backend (recall@3 0.987 vs flat at nprobe=32)"]  # fmt: skip


def compressed(folder: Path, name: str, recall: float | None, source: str = "flat.index", rows: int = ROWS) -> Path:
    """A small IVF index file with a build record: recall@3 ``recall`` at its stored nprobe 2 (None: not measured)."""
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    index = faiss.index_factory(DIM, "IVF4,SQ8", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = 2
    path = folder / name
    faiss.write_index(index, str(path))
    curve = [RecallPoint(1, {"3": 0.5})] + ([RecallPoint(2, {"1": 1.0, "3": recall})] if recall is not None else [])
    write_record(path, BuildRecord("ivf_sq8", "IVF4,SQ8", rows, DIM, path.stat().st_size, source, ROWS, "nprobe", 2,
                                   100, "held-out rows", curve))  # fmt: skip
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    flat = faiss.IndexFlatIP(DIM)
    flat.add(np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32))
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    return tmp_path


def test_auto_picks_the_highest_stored_recall_among_the_flat_indexs_own(folder):
    compressed(folder, "a_ivf.index", 0.91)
    compressed(folder, "b_ivf.index", 0.97, source=str(folder / "flat.index"))  # named by its full path
    compressed(folder, "c_ivf.index", None)  # not measured at its stored value
    compressed(folder, "other.index", 0.999, source="another_Flat.index")  # another flat index's
    compressed(folder, "fewer.index", 0.999, rows=ROWS - 1)  # another corpus
    compressed(folder, "gone.index", 0.999).unlink()  # a record whose index was removed
    best = find_fallback(folder / "flat.index", ROWS, 3)
    assert best is not None and best.path.name == "b_ivf.index" and best.recall == 0.97
    assert best.recall_note.startswith("recall@3 0.970 vs flat at nprobe=2")
    at_one = find_fallback(folder / "flat.index", ROWS, 3, {"nprobe": 1})  # ranked as stored, then told as served
    assert at_one.path.name == "b_ivf.index" and at_one.recall == 0.5


def test_auto_finds_none_when_no_record_names_the_flat_index(folder):
    compressed(folder, "other.index", 0.99, source="another_Flat.index")
    assert find_fallback(folder / "flat.index", ROWS, 3) is None


def test_an_explicit_fallback_of_another_corpus_is_refused(folder):
    path = compressed(folder, "ivf.index", 0.9, rows=ROWS + 5)
    with pytest.raises(IndexLoadError, match=r"--cpu_index ivf.index: its build record \(ivf.index.build.json\) "
                       r"holds 1,005 rows, the flat index flat.index 1,000: not the same corpus"):  # fmt: skip
        given_fallback(path, folder / "flat.index", ROWS, 3)
    with pytest.raises(IndexLoadError, match="no such index file"):
        given_fallback(folder / "none.index", folder / "flat.index", ROWS, 3)


def config_for(folder: Path, **kw) -> ServerConfig:
    return ServerConfig(index_path=folder / "flat.index", corpus_path=folder / "corpus.jsonl", **kw)


def test_choose_serves_the_fallback_only_when_the_plan_does_not_fit(folder, caplog):
    compressed(folder, "flat_ivf_sq8.index", 0.95)
    layout = IndexLayout(ROWS, DIM, "float16", 75 * GIB, scratch_bytes=GIB)
    over = Plan(plan_memory(layout, [Device("cuda:0", H100)]), layout, "flat.index")
    caplog.set_level(logging.INFO)
    served = choose(config_for(folder, cpu_index="auto", nprobe=1), over)
    assert served is not None and (served.index_path, served.backend) == (folder / "flat_ivf_sq8.index", "faiss")
    assert not served.faiss_gpu
    assert "serving flat_ivf_sq8.index on the CPU instead with the faiss backend (recall@3 0.500 vs flat at " \
           "nprobe=1" in caplog.text  # fmt: skip
    small = IndexLayout(ROWS, DIM, "float16", 10 * GIB)
    caplog.clear()
    fits = Plan(plan_memory(small, [Device("cuda:0", H100)]), small, "flat.index")
    assert choose(config_for(folder, cpu_index="auto", nprobe=4), fits) is None
    assert "--cpu_index auto is unused" in caplog.text
    assert "--nprobe applies to the --cpu_index fallback, which is not served" in caplog.text


def test_load_engine_serves_the_fallback_when_the_gpu_plan_does_not_fit(
    tmp_path, minilm_index, toy_dataset, minilm_path, toy_questions, monkeypatch, caplog
):
    """A plan over the fraction (fake GPU shares: there is none here) loads the --cpu_index on the CPU, at --nprobe;
    a fallback without a record that holds other rows is refused once loaded."""
    import local_dense_retriever.memory_plan as memory_plan
    from local_dense_retriever.engine import load_engine

    vectors = np.load(minilm_index["npy"])
    flat = tmp_path / "minilm_Flat.index"
    flat.symlink_to(minilm_index["faiss"])
    ivf = faiss.index_factory(vectors.shape[1], "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.add(vectors)
    faiss.write_index(ivf, str(tmp_path / "minilm_ivf.index"))
    write_record(tmp_path / "minilm_ivf.index", BuildRecord("ivf_flat", "IVF4,Flat", len(vectors), vectors.shape[1],
                 1, "minilm_Flat.index", len(vectors), "nprobe", 1, 50, "toy questions",
                 [RecallPoint(4, {"3": 1.0})]))  # fmt: skip
    real = memory_plan.make_plan

    def on_a_small_gpu(config, backend):
        found = real(config, backend)
        if backend != "torch":
            return found
        return Plan(plan_memory(found.layout, [Device("cuda:0", 1 << 18)]), found.layout, found.source)

    monkeypatch.setattr(memory_plan, "make_plan", on_a_small_gpu)
    common = {"corpus_path": toy_dataset.corpus_path, "retriever_name": "minilm", "retriever_model": str(minilm_path),
              "device": "cpu"}  # fmt: skip
    caplog.set_level(logging.INFO)
    engine = load_engine(ServerConfig(index_path=flat, cpu_index="auto", nprobe=4, **common), progress=False)
    assert engine.index_report(3)["type"] == "ivf_flat" and engine.index_report(3)["search_value"] == 4
    assert engine.index_report(3)["recall"] == {"3": 1.0}
    assert "serving minilm_ivf.index on the CPU instead with the faiss backend" in caplog.text
    q = next(q for q in toy_questions if q["metadata"]["hops"] == 1)
    assert engine.search([q["question"]], 3)[0][0][0]["id"] in q["metadata"]["supporting_ids"]

    fewer = faiss.index_factory(vectors.shape[1], "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    fewer.train(vectors)
    fewer.add(vectors[:-1])
    faiss.write_index(fewer, str(tmp_path / "fewer.index"))
    with pytest.raises(IndexLoadError, match=r"--cpu_index fewer.index holds 299 rows, the flat index 300"):
        load_engine(ServerConfig(index_path=flat, cpu_index=str(tmp_path / "fewer.index"), **common), progress=False)
