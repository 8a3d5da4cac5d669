"""The pre-scans (bf16, int8) of a float32 flat index on the CPU, behind the index-scan interface: the float32 scan's
answers on every CPU, crowded queries gathered, 'auto' giving up where most crowd, a proven bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from local_dense_retriever.accel import prescan
from local_dense_retriever.accel.coarse_copy import Bf16Copy, Int8Copy
from local_dense_retriever.accel.prescan import Prescan, kept_rows
from local_dense_retriever.accel.rule import COPIES, fast_here
from local_dense_retriever.config import ServerConfig, cpu_flags
from local_dense_retriever.index.torch_flat import TorchFlatIndex

CPU = torch.device("cpu")

#: every coarse copy: each must give the float32 scan's answers
COARSE = pytest.mark.parametrize("coarse", ["bfloat16", "int8"])


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _pre(vectors, coarse, auto=False, **kw):
    return TorchFlatIndex(vectors, device=CPU, cpu_scan=Prescan.wrapper(COPIES[coarse], auto=auto), **kw)


def _pair(vectors, coarse, **kw):
    return TorchFlatIndex(vectors, device=CPU, **kw), _pre(vectors, coarse, **kw)


@COARSE
@pytest.mark.parametrize("k", [1, 3, 10])
def test_the_pre_scan_returns_the_float32_scans_answers(rng, k, coarse):
    vectors = _unit(rng, 20_000, 16)
    queries = torch.from_numpy(_unit(rng, 40, 16))
    # two blocks, one margin for both: 12,000 rows (kept through their groups' maxima, and a partial last group) and
    # 8,000 (few enough groups for one top-k)
    plain, pre = _pair(vectors, coarse, cpu_chunk_rows=12_000)
    assert f"{coarse} pre-scan" in pre.describe() and "pre-scan" not in plain.describe()
    p_scores, p_ids = plain.search(queries, k)
    f_scores, f_ids = pre.search(queries, k)
    np.testing.assert_array_equal(f_ids, p_ids)
    np.testing.assert_allclose(f_scores, p_scores, rtol=0, atol=1e-6)
    assert f_scores.dtype == np.float32 and f_ids.dtype == np.int64
    assert pre.crowded_queries == 0  # random unit vectors: a few rows near each k-th score, far below the rows kept


@COARSE
def test_near_ties_the_copy_cannot_separate_are_ranked_as_float32_ranks_them(rng, coarse):
    """Rows that differ below the copy's resolution get one coarse score; the float32 re-scoring orders them exactly,
    and exact duplicates come in id order as in the float32 scan."""
    base = _unit(rng, 1, 32)[0]
    near = base + rng.standard_normal((20, 32)).astype(np.float32) * 1e-4  # 20 rows, scores ~1e-4 apart
    vectors = np.concatenate([_unit(rng, 3000, 32), near, near[:5]])  # and 5 exact duplicates of near ones
    queries = torch.from_numpy(np.stack([base, *_unit(rng, 7, 32)]))
    plain, pre = _pair(vectors, coarse)
    p_scores, p_ids = plain.search(queries, 8)
    f_scores, f_ids = pre.search(queries, 8)
    np.testing.assert_array_equal(f_ids, p_ids)
    np.testing.assert_allclose(f_scores, p_scores, rtol=0, atol=1e-6)
    assert len(set(f_ids[0])) == 8 and set(f_ids[0]) <= set(range(3000, 3025))


@COARSE
@pytest.mark.parametrize("chunk", [None, 2_900])
@pytest.mark.parametrize("most", [None, 50])
def test_a_query_whose_scores_crowd_gets_every_row_within_its_margin(rng, monkeypatch, chunk, most, coarse):
    """More rows within the coarse margin of a query's k-th score than the pre-scan keeps: near-duplicates spread over
    the index (so, chunked, over several blocks, the first ones met under a threshold still rising) and exact
    duplicates (equal float32 scores: the lower ids win). Only those queries are counted crowded, and every answer
    is the float32 scan's: the rows gathered from the blocks' scores, or, beyond ``CROWDED_ROWS`` of them, the
    query scanned again in float32."""
    if most is not None:
        monkeypatch.setattr(prescan, "CROWDED_ROWS", most)
    base, dup = _unit(rng, 2, 32)
    vectors = _unit(rng, 12_400, 32)
    vectors[::31] = base + rng.standard_normal((400, 32)).astype(np.float32) * 1e-3  # 400 rows within ~0.003
    vectors[7::41] = dup  # 303 copies of one vector
    queries = torch.from_numpy(np.stack([*_unit(rng, 5, 32), base, dup]))
    plain, pre = _pair(vectors, coarse, **({"cpu_chunk_rows": chunk} if chunk else {}))
    rescanned = []
    exact = pre.scan.exact
    topk = exact.topk
    monkeypatch.setattr(exact, "topk", lambda q, k: rescanned.append(len(q)) or topk(q, k))
    p_scores, p_ids = plain.search(queries, 5)
    f_scores, f_ids = pre.search(queries, 5)
    np.testing.assert_array_equal(f_ids, p_ids)
    np.testing.assert_allclose(f_scores, p_scores, rtol=0, atol=1e-6)
    assert f_ids[-1].tolist() == [7 + 41 * j for j in range(5)]
    assert pre.crowded_queries == 2
    assert rescanned == ([] if most is None else [2])  # the two crowded queries, scanned in float32 together
    pre.search(queries[-1:], 5)
    assert pre.crowded_queries == 3


@COARSE
def test_auto_gives_the_pre_scan_up_when_most_queries_crowd_and_a_named_one_keeps_it(rng, monkeypatch, caplog, coarse):
    """An encoder whose scores sit closer than the copy can tell apart crowds most queries: under 'auto' the index
    says so once and searches in float32 from then on (the same answers); asked for by name, the pre-scan stays."""
    monkeypatch.setattr(prescan, "CROWDED_TRIAL", 40)
    base = _unit(rng, 1, 32)[0]
    vectors = np.concatenate([_unit(rng, 1_000, 32), base + rng.standard_normal((500, 32)).astype(np.float32) * 1e-3])
    crowded = torch.from_numpy(np.stack([base + rng.standard_normal(32).astype(np.float32) * 1e-3 for _ in range(8)]))
    auto = _pre(vectors, coarse, auto=True)
    named = _pre(vectors, coarse)
    plain = TorchFlatIndex(vectors, device=CPU)
    assert f"{coarse} pre-scan" in auto.describe()
    with caplog.at_level("WARNING", logger=prescan.__name__):
        for _ in range(6):
            for index in (auto, named):
                np.testing.assert_array_equal(index.search(crowded, 5)[1], plain.search(crowded, 5)[1])
    assert "pre-scan" not in auto.describe() and "pre-scan" in named.describe()
    assert auto.scan.copy is None and named.scan.copy.name == coarse  # auto's copy is freed
    assert auto.crowded_queries == 40 and named.crowded_queries == 48  # auto stopped counting when it gave up
    said = [r.getMessage() for r in caplog.records if "pre-scan" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{coarse} pre-scan: 100% of the first 40 queries' blocks had more")
    assert f"--index_prefilter {coarse} keeps the pre-scan" in said[0]


def test_auto_keeps_a_pre_scan_whose_queries_crowd_in_one_block_of_many(rng, monkeypatch, caplog):
    """Every query crowds, but in one block of ten: that costs about a tenth of a float32 scan, so under 'auto' the
    pre-scan stays (it is the share of crowded blocks that gives it up, not of crowded queries)."""
    monkeypatch.setattr(prescan, "CROWDED_TRIAL", 40)
    base = _unit(rng, 1, 32)[0]
    vectors = _unit(rng, 20_000, 32)
    vectors[4_000:4_300] = base + rng.standard_normal((300, 32)).astype(np.float32) * 1e-3  # all in one block
    crowded = torch.from_numpy(np.stack([base + rng.standard_normal(32).astype(np.float32) * 1e-3 for _ in range(8)]))
    auto = _pre(vectors, "int8", auto=True, cpu_chunk_rows=2_000)
    plain = TorchFlatIndex(vectors, device=CPU)
    with caplog.at_level("WARNING", logger=prescan.__name__):
        for _ in range(6):
            np.testing.assert_array_equal(auto.search(crowded, 5)[1], plain.search(crowded, 5)[1])
    assert auto.crowded_queries == 48 and "int8 pre-scan" in auto.describe()
    assert not [r for r in caplog.records if "pre-scan" in r.getMessage()]


@pytest.mark.parametrize("columns", [100, 600, 20_000, 20_100])
def test_kept_rows_leave_out_nothing_above_their_floor(rng, columns):
    """Whatever is kept, every score left out is at most the floor, and what is kept is the best there is: with the
    best scores packed into one group (the floor is the last score kept) or spread over every group (the floor is
    the best group left out), and with ties."""
    scores = torch.from_numpy(rng.standard_normal((6, columns)).astype(np.float32)).bfloat16()
    scores[1, : min(columns, 300)] = 5.0  # one group full of equal best scores
    scores[2, ::256] = 4.0 + torch.arange(len(range(0, columns, 256))) / 1000  # a high score in every group
    scores[3] = 1.0  # all tied
    s, cols, floor = kept_rows(scores, keep=10, groups=4)
    assert s.shape == cols.shape and s.shape[0] == 6
    for row in range(6):
        left_out = torch.ones(columns, dtype=torch.bool)
        left_out[cols[row]] = False
        assert len(set(cols[row].tolist())) == cols.shape[1]  # no column twice
        torch.testing.assert_close(s[row], scores[row, cols[row]].float())
        if left_out.any():
            assert scores[row, left_out].float().max() <= floor[row]
        else:
            assert floor[row] == -torch.inf
        assert s[row].max() == scores[row].float().max()


@COARSE
def test_an_empty_batch_and_a_zero_query_get_answers_of_their_shape(rng, coarse):
    plain, pre = _pair(_unit(rng, 5_000, 16), coarse)
    scores, ids = pre.search(torch.empty(0, 16), 3)
    assert scores.shape == ids.shape == (0, 3)
    zero = torch.zeros(2, 16)  # every score 0: the lowest ids, as the float32 scan gives them
    np.testing.assert_array_equal(pre.search(zero, 3)[1], plain.search(zero, 3)[1])


@COARSE
def test_a_querys_answer_does_not_depend_on_its_batch_mates(rng, coarse):
    vectors = _unit(rng, 6000, 24)
    queries = torch.from_numpy(_unit(rng, 33, 24))
    _, pre = _pair(vectors, coarse)
    _, together = pre.search(queries, 4)
    alone = np.concatenate([pre.search(queries[j : j + 1], 4)[1] for j in range(len(queries))])
    np.testing.assert_array_equal(together, alone)


@COARSE
@pytest.mark.parametrize("dim", [8, 384, 1024])
def test_the_score_bound_holds_for_the_coarse_matmuls_and_float32_re_scores(rng, dim, coarse):
    """The bound the margin rests on, checked against float64 over vectors of mixed norms and signs, including
    same-signed ones (their rounding errors add up instead of cancelling) and a zero query: it must hold for every
    pair, and not be loose by orders."""
    q = rng.standard_normal((64, dim)) * rng.uniform(0.1, 10, (64, 1))
    x = rng.standard_normal((2000, dim)) * rng.uniform(0.1, 10, (2000, 1))
    x[:100] = np.abs(x[:100])
    q[:8] = np.abs(q[:8])
    q[8] = 0
    q32, x32 = torch.from_numpy(q).float(), torch.from_numpy(x).float()
    copy = {"bfloat16": Bf16Copy, "int8": Int8Copy}[coarse].of(x32, rows_per_step=300)
    exact = q32.double() @ x32.double().T  # the inner products of the float32 vectors
    prepared, unit = copy.prepared(q32)
    out = lambda queries, rows, dtype: torch.empty((queries, rows), dtype=dtype)  # noqa: E731
    # as the pre-scan compares them: bf16 scores made float32; int32 sums made float32, in units of the query's
    pre_scan = copy.scores(prepared, 0, len(x32), out).float().double() * unit[:, None]
    re_score = (q32 @ x32.T).double()
    error = (pre_scan - exact).abs() + (re_score - exact).abs()
    bound = copy.bounds(q32)[:, None]
    assert (error <= bound).all()
    assert (error / bound).max() > 0.05


#: the copies this CPU has the instructions for: the rule refuses the others by name
FAST_HERE = [name for name in COPIES if fast_here(name, cpu_flags())]


@pytest.mark.skipif(not FAST_HERE, reason="this CPU has neither bf16 (AMX, AVX512-BF16) nor int8 (VNNI) matmuls")
def test_the_server_flag_reaches_the_index_and_answers_stay_the_same(minilm_index, toy_dataset, minilm_path):
    """``--index_prefilter`` as the server parses it, through the engine the server builds: same hits either way."""
    from local_dense_retriever.engine import load_engine
    from local_dense_retriever.retrieval_server import config_from_args

    base = ["--index_path", str(minilm_index["npy"]), "--corpus_path", str(toy_dataset.corpus_path),
            "--retriever_name", "minilm", "--retriever_model", str(minilm_path), "--device", "cpu"]  # fmt: skip
    names = [*FAST_HERE, "off"]
    engines = [load_engine(config_from_args([*base, "--index_prefilter", name])[0], progress=False) for name in names]
    assert [f"{name} pre-scan" in engine.describe() for name, engine in zip(names, engines, strict=True)] == [
        name != "off" for name in names
    ]
    assert "pre-scan" not in engines[-1].describe()
    questions = ["who founded the city?", "which river runs past the old mill", "capital"]
    hits = [[[doc["id"] for doc, _ in q] for q in engine.search(questions, 5)] for engine in engines]
    assert all(h == hits[-1] for h in hits)
    assert all(engine.prefilter_crowded() == 0 for engine in engines)  # /metrics prefilter_crowded_queries_total
    with pytest.raises(SystemExit):
        config_from_args([*base, "--index_prefilter", "int4"])


@pytest.mark.skipif(not FAST_HERE, reason="this CPU has neither bf16 (AMX, AVX512-BF16) nor int8 (VNNI) matmuls")
def test_a_fleet_shard_pre_scans_its_rows_of_the_mapped_index(tmp_path, rng):
    """The fleet's shards hold row ranges of one memory-mapped index: each pre-scans its own range (the flag reaches
    it through the config) and the shards' answers are those of the float32 scan."""
    from local_dense_retriever.index.topk import merge_topk
    from local_dense_retriever.serve.shards import ShardSearcher

    vectors = _unit(rng, 6_000, 16)
    np.save(tmp_path / "flat.npy", vectors)
    queries = _unit(rng, 9, 16)
    answers = {}
    for name in (*FAST_HERE, "off"):
        config = ServerConfig(index_path=tmp_path / "flat.npy", corpus_path=tmp_path / "corpus.jsonl", device="cpu",
                              index_prefilter=name)  # fmt: skip
        shards = [ShardSearcher(config, shard, 2) for shard in range(2)]
        assert all((f"{name} pre-scan" in s.index.describe()) == (name != "off") for s in shards)
        parts = [s.search(queries, 4) for s in shards]
        scores, ids = (np.concatenate([p[j] for p in parts], axis=1) for j in (0, 1))
        answers[name] = merge_topk(scores, ids, 4)
    for name in FAST_HERE:
        np.testing.assert_array_equal(answers[name][1], answers["off"][1])
        np.testing.assert_allclose(answers[name][0], answers["off"][0], rtol=0, atol=1e-6)


@COARSE
def test_loading_a_pre_scanned_index_grows_memory_by_the_copy_not_the_file(big_flat_index, load_peak_rss, coarse):
    """Peak RSS grows by the copy (bf16: half the file; int8: a quarter) and a few steps of the copy's work, not by
    the file: each step's rows of the memory map leave RSS once read."""
    step = 8 << 20
    rows, grew = load_peak_rss(big_flat_index, coarse, step)
    size = big_flat_index.stat().st_size
    most = size // (2 if coarse == "bfloat16" else 4) + size // 10 + 8 * step  # the steps' temporaries, malloc's
    assert rows == 200_000 and grew < most, f"peak RSS grew by {grew >> 20} MB loading a {size >> 20} MB index"
