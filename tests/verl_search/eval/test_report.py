"""`python -m verl_search.report DIR` on a dump written by verl's `_write_generations`, scored by our reward."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl_search.report import PAPER_AVERAGE, build_report, main, render_markdown
from verl_search.reward import compute_score

# (data source, question, gold answers); Bamboogle's and HotpotQA's "Paris" rows share gold answers on purpose
VAL_ROWS = [
    ("searchR1_nq", "who wrote the hobbit?", ["J. R. R. Tolkien", "Tolkien"]),
    ("searchR1_nq", "what is the capital of norway?", ["Oslo"]),
    ("searchR1_triviaqa", "which planet is known as the red planet?", ["Mars"]),
    ("searchR1_triviaqa", "what is the largest ocean?", ["Pacific Ocean", "Pacific"]),
    ("searchR1_popqa", "what is the occupation of ada lovelace?", ["mathematician"]),
    ("searchR1_hotpotqa", "which city hosted the 1900 olympics and the 1924 olympics?", ["Paris"]),
    ("searchR1_bamboogle", "what city is home to the louvre?", ["Paris"]),
    ("searchR1_bamboogle", "who painted the mona lisa?", ["Leonardo da Vinci"]),
]


def _response(answer: str | None, searches: int, failed: int = 0) -> str:
    parts = []
    for i in range(searches):
        parts.append(f"<think>look it up</think><search>query {i}</search>")
        body = "[search failed: timeout] The search service did not answer in time." if i < failed else "Doc 1 ..."
        parts.append(f"\n\n<information>{body}</information>\n\n")
    if answer is not None:
        parts.append(f"<answer>{answer}</answer>")
    return "".join(parts)


# per val row: (answer or None, searches, failed searches) of the two sampled responses
PLAN = [
    [("Tolkien", 1, 0), ("C. S. Lewis", 2, 1)],
    [("Oslo", 1, 0), ("Oslo", 0, 0)],
    [("Mars", 1, 0), (None, 3, 3)],
    [("Atlantic", 2, 0), ("the Pacific", 1, 0)],
    [("mathematician", 1, 0), ("poet", 1, 0)],
    [("Paris", 2, 0), ("Paris", 2, 0)],
    [("London", 1, 0), ("London", 1, 0)],
    [("Leonardo da Vinci", 3, 1), ("Leonardo da Vinci", 1, 0)],
]
EXPECTED_EM = {"NQ": 0.75, "TriviaQA": 0.5, "PopQA": 0.5, "HotpotQA": 1.0, "Bamboogle": 0.5}


@pytest.fixture(scope="module")
def write_generations():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return RayPPOTrainer._write_generations


@pytest.fixture
def val_parquet(tmp_path: Path) -> Path:
    """Validation rows in the preprocessed (verl RLHFDataset) layout."""
    rows = [
        {
            "data_source": src,
            "prompt": [{"role": "user", "content": f"Answer the question. Question: {q}"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"index": i, "split": "test", "question": q},
        }
        for i, (src, q, golds) in enumerate(VAL_ROWS)
    ]
    path = tmp_path / "test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def _dump(write_generations, folder: Path, step: int, plan: list, *, with_source: bool = False) -> None:
    """Score every planned response with our reward and dump it exactly as verl's validation does (shuffled)."""
    samples = []
    for (src, q, golds), responses in zip(VAL_ROWS, plan, strict=True):
        for answer, searches, failed in responses:
            out = _response(answer, searches, failed)
            prompt = f"system\nYou are a helpful assistant.\nuser\nAnswer the question. Question: {q}\nassistant\n"
            samples.append((src, prompt, out, {"target": golds}, compute_score(src, out, {"target": golds})))
    random.Random(step).shuffle(samples)  # verl's validation dataloader shuffles
    extras: dict[str, list] = {"reward": [s[4]["score"] for s in samples]}
    for key in ("em", "subem", "f1", "answered", "num_searches"):
        extras[key] = [s[4][key] for s in samples]
    if with_source:
        extras["data_source"] = [s[0] for s in samples]
    write_generations(
        [s[1] for s in samples],
        [s[2] for s in samples],
        [s[3] for s in samples],
        extras["reward"],
        extras,
        str(folder),
        step,
    )


def _run(*args: str) -> tuple[int, str, str]:
    res = subprocess.run(
        [sys.executable, "-m", "verl_search.report", *args], capture_output=True, text=True, check=False
    )
    return res.returncode, res.stdout, res.stderr


def test_report_matches_hand_computed_em_and_writes_both_files(
    tmp_path: Path, val_parquet: Path, write_generations, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "val"
    _dump(write_generations, dump, 10, [[("nothing", 0, 0)] * 2] * len(VAL_ROWS))
    _dump(write_generations, dump, 20, PLAN)
    capsys.readouterr()  # verl's writer prints a line per dump
    assert main([str(dump), "--data", str(val_parquet)]) == 0
    report = json.loads((dump / "report.json").read_text())
    assert report["step"] == 20, "the latest step is the default"
    labels = {"searchR1_nq": "NQ", "searchR1_triviaqa": "TriviaQA", "searchR1_popqa": "PopQA"}
    labels |= {"searchR1_hotpotqa": "HotpotQA", "searchR1_bamboogle": "Bamboogle"}
    assert {labels[s]: d["em"] for s, d in report["datasets"].items()} == EXPECTED_EM
    nq = report["datasets"]["searchR1_nq"]
    assert nq["n"] == 4 and nq["searches_per_question"] == 1.0 and nq["failed_searches"] == 1
    assert report["datasets"]["searchR1_triviaqa"]["answer_rate"] == 0.75
    assert report["datasets"]["searchR1_triviaqa"]["failed_search_rate"] == pytest.approx(3 / 7)
    assert report["average"]["em"] == pytest.approx(sum(EXPECTED_EM.values()) / 5)
    assert report["average"]["paper_em_same_datasets"] == pytest.approx((0.397 + 0.565 + 0.391 + 0.331 + 0.232) / 5)
    assert report["unmatched_rows"] == 0

    printed = capsys.readouterr().out
    table = printed.split("\n\n")[0].splitlines()
    assert len({len(line) for line in table}) == 1, "aligned columns"
    header, ours, paper = table[0].split(), table[1], table[2]
    assert header[:7] == ["NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle"]
    assert ours.split()[3:] == ["0.750", "0.500", "0.500", "1.000", "-", "-", "0.500", "0.650"]
    assert paper.split()[2:] == ["0.397", "0.565", "0.391", "0.331", "0.310", "0.124", "0.232", "0.383"]
    assert "Missing datasets (2Wiki, MuSiQue)" in printed and f"{PAPER_AVERAGE:.3f}" in printed
    markdown = (dump / "report.md").read_text()
    assert markdown.startswith("# Search-R1 evaluation, step 20")
    assert "| EM (this run) | 0.750 | 0.500 | 0.500 | 1.000 | - | - | 0.500 | 0.650 |" in markdown
    assert not [p for p in dump.iterdir() if p.name.startswith(".")], "no temporary files left"


def test_step_option_and_rows_that_carry_their_data_source(tmp_path: Path, write_generations) -> None:
    dump = tmp_path / "val"
    _dump(write_generations, dump, 10, [[("nothing", 0, 0)] * 2] * len(VAL_ROWS), with_source=True)
    _dump(write_generations, dump, 20, PLAN, with_source=True)
    assert main([str(dump), "--step", "10"]) == 0  # no --data needed: the rows name their source
    report = json.loads((dump / "report.json").read_text())
    assert report["step"] == 10
    assert all(d["em"] == 0.0 for d in report["datasets"].values())
    assert report["average"]["datasets"] == ["NQ", "TriviaQA", "PopQA", "HotpotQA", "Bamboogle"]


def test_cli_prints_the_table(tmp_path: Path, val_parquet: Path, write_generations) -> None:
    dump = tmp_path / "val"
    _dump(write_generations, dump, 5, PLAN)
    rc, out, err = _run(str(dump), "--data", str(val_parquet))
    assert rc == 0, err
    assert out.splitlines()[1].split()[:4] == ["EM", "(this", "run)", "0.750"]
    assert out.rstrip().endswith(f"wrote {dump / 'report.md'} and {dump / 'report.json'}")


def test_cli_error_is_one_line_and_exit_1(tmp_path: Path) -> None:
    rc, out, err = _run(str(tmp_path / "missing"))
    assert rc == 1 and out == ""
    assert err == f"report: error: {tmp_path / 'missing'} is not a folder (pass trainer.validation_data_dir)\n"


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("report: error: ") and err.count("\n") == 1
    return err


def test_bad_inputs_fail_with_one_line(
    tmp_path: Path, val_parquet: Path, write_generations, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no validation dumps" in _one_line_error([str(empty)], capsys)
    dump = tmp_path / "val"
    _dump(write_generations, dump, 7, PLAN)
    err = _one_line_error([str(dump), "--step", "3"], capsys)
    assert "no dump for step 3" in err and "steps found: 7" in err
    assert "pass --data" in _one_line_error([str(dump)], capsys)
    missing = str(tmp_path / "nope.parquet")
    assert "cannot read validation data" in _one_line_error([str(dump), "--data", missing], capsys)
    with open(dump / "7.jsonl", "a", encoding="utf-8") as f:
        f.write("{truncated\n")
    assert "7.jsonl:17: not valid JSON" in _one_line_error([str(dump), "--data", str(val_parquet)], capsys)
    (dump / "8.jsonl").write_text(json.dumps({"output": "x", "gts": {"target": ["x"]}}) + "\n")
    assert "neither 'em' nor 'score'" in _one_line_error([str(dump), "--data", str(val_parquet)], capsys)
    assert not (dump / "report.json").exists()


def test_rows_of_another_validation_set_are_reported_as_unmatched(
    tmp_path: Path, val_parquet: Path, write_generations, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "val"
    _dump(write_generations, dump, 1, PLAN)
    with open(dump / "1.jsonl", "a", encoding="utf-8") as f:
        f.write(
            json.dumps({"input": "q", "output": "<answer>x</answer>", "gts": {"target": ["zzz"]}, "score": 0}) + "\n"
        )
    assert main([str(dump), "--data", str(val_parquet)]) == 0
    report = json.loads((dump / "report.json").read_text())
    assert report["unmatched_rows"] == 1 and report["num_responses"] == 17
    other = tmp_path / "other"
    other.mkdir()
    (other / "1.jsonl").write_text(json.dumps({"input": "q", "output": "", "gts": ["zzz"], "score": 0}) + "\n")
    assert "none of the 1 rows matched" in _one_line_error([str(other), "--data", str(val_parquet)], capsys)


def test_gold_in_results_tells_a_reading_failure_from_a_retrieval_failure() -> None:
    """A response that retrieved the answer but wrote another one counts as 'gold in results'; a gold answer only in
    the model's own text or inside a longer word does not."""

    def row(output: str, golds: list[str]) -> dict:
        return {"output": output, "gts": {"target": golds}, "score": 0.0, "data_source": "nq"}

    rows = [
        row(
            "<search>q</search><information>Doc 1 ... born in Oslo, Norway.</information><answer>Bergen</answer>",
            ["oslo"],
        ),
        row("<tool_call>{}</tool_call><tool_response>The Hobbit, by J.R.R. Tolkien</tool_response>", ["Tolkien"]),
        row("<search>q</search><information>Doc 1 ... Marseille</information><answer>Mars</answer>", ["Mars"]),
        row("<answer>Paris</answer>", ["Paris"]),
    ]
    report = build_report(rows, None)
    assert report["datasets"]["searchR1_nq"]["gold_retrieved_rate"] == 0.5
    assert "| gold in results | 50.0% |" in render_markdown(report, 0, Path("val"))


def test_metrics_option_draws_the_runs_search_health(tmp_path: Path, write_generations) -> None:
    """``--metrics``: per-step curves of the search/* metrics of a run (what a user looks at for its health)."""
    dump = tmp_path / "val"
    _dump(write_generations, dump, 10, PLAN, with_source=True)
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w") as f:
        for step in range(1, 9):
            data = {
                "critic/score/mean": 0.1 * step,
                "search/calls_per_traj/mean": 2.0 if step < 6 else 0.0,
                "search/calls_per_traj/share_0": 0.1 if step < 6 else 1.0,
                "search/answered_share": 0.9,
                "search/gold_in_results_share": 0.5,
                "search/failed_share": 0.0 if step < 4 else 0.5,
                "search/failed/timeout": 0 if step < 4 else 3,
                "search/latency_s/p50": 0.05,
                "search/latency_s/p99": 0.4,
                "search/wait_share": 0.1,
            }
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    assert main([str(dump), "--metrics", str(metrics)]) == 0
    written = sorted(p.name for p in (dump / "health").iterdir())
    assert written == [
        "health_answers.png", "health_failures.png", "health_latency.png", "health_searches.png", "search_health.png",
    ]  # fmt: skip
    assert all((dump / "health" / name).stat().st_size > 5_000 for name in written)  # drawn, not empty
    assert main([str(dump), "--metrics", str(tmp_path / "absent.jsonl")]) == 1


def _metrics_file(path: Path, steps: range, searches: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for step in steps:
            data = {"search/calls_per_traj/mean": searches, "search/answered_share": 0.9, "critic/score/mean": 0.2}
            f.write(json.dumps({"step": step, "data": data}) + "\n")


def test_a_run_folder_gives_the_report_and_the_health_of_every_launch(tmp_path: Path, write_generations, capsys):
    """``python -m verl_search.report RUN_DIR``: a run folder as the run scripts leave it after a relaunch (the
    first launch's metrics kept in metrics/, the resumed one's in metrics.jsonl, logging steps 4-5 again)."""
    from verl_search.eval.plots import read_metrics, run_metrics_files

    run = tmp_path / "runs" / "exp"
    _metrics_file(run / "metrics" / "20261128-210000-41.jsonl", range(1, 6), searches=1.0)
    _metrics_file(run / "metrics.jsonl", range(4, 9), searches=2.0)
    _dump(write_generations, run / "val_generations", 8, PLAN, with_source=True)
    files = run_metrics_files(run)
    assert [p.name for p in files] == ["20261128-210000-41.jsonl", "metrics.jsonl"]
    merged = read_metrics(*files)
    assert sorted(merged) == list(range(1, 9))
    assert merged[3]["search/calls_per_traj/mean"] == 1.0 and merged[4]["search/calls_per_traj/mean"] == 2.0

    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "NQ" in out and f"wrote {run / 'val_generations' / 'report.md'}" in out
    assert "from 2 metrics file(s)" in out
    assert (run / "health" / "search_health.png").stat().st_size > 5_000


def test_a_run_folder_without_validation_yet_draws_its_health_and_an_empty_one_is_refused(tmp_path: Path, capsys):
    run = tmp_path / "run"
    _metrics_file(run / "metrics.jsonl", range(1, 3), searches=1.0)
    assert main([str(run)]) == 0
    assert "no validation dumps in" in capsys.readouterr().out
    assert (run / "health" / "search_health.png").is_file()
    empty = tmp_path / "empty"
    (empty / "metrics").mkdir(parents=True)
    assert main([str(empty)]) == 1
    assert f"{empty} holds neither metrics nor validation dumps yet" in capsys.readouterr().err
