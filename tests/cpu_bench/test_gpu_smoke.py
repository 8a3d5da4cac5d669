"""``make gpu-smoke``: its dry run builds the toy world, starts its retriever and passes the recipe script's preflight
here (no GPU); its checks read a run folder as a GPU run leaves it and fail for each thing a long run depends on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cpu_bench.gpu_smoke import UNMASKED_LIMIT, check_run

REPO = Path(__file__).resolve().parents[2]


def test_the_dry_run_passes_the_preflight_with_the_small_model_and_two_steps(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "cpu_bench.gpu_smoke", "--dry-run", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "preflight: passed" in done.stderr
    command = done.stdout.split("command:", 1)[1]
    for setting in (
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.n_gpus_per_node=1",
    ):
        assert setting in command, setting
    assert "OK      retriever: http://127.0.0.1:" in done.stderr  # the toy retriever answered the probe
    assert "gpu-smoke: dry run: the script's checks passed" in done.stdout
    assert (tmp_path / "data" / "val_subset.parquet").is_file() and (tmp_path / "world" / "corpus.jsonl").is_file()


def run_folder(tmp_path: Path, *, unmasked: float | None = 0.0, searches: float = 1.5, checkpoint: bool = True) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    with (run / "metrics.jsonl").open("w") as f:
        for step in (1, 2):
            data = {"actor/pg_loss": 0.1, "search/calls_per_traj/mean": searches}
            if unmasked is not None:
                data["search/unmasked_results_share"] = unmasked
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    if checkpoint:
        (run / "checkpoints" / "global_step_2" / "actor").mkdir(parents=True)
    return run


def failed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAILED")]


def test_a_healthy_run_passes_every_check(tmp_path):
    lines = check_run(run_folder(tmp_path), 2, served=12)
    assert failed(lines) == [] and len(lines) == 5


def test_each_thing_a_long_run_depends_on_fails_its_own_check(tmp_path):
    assert failed(check_run(run_folder(tmp_path / "a"), 2, served=0)) == [
        "FAILED: the retriever answered 0 search request(s)"
    ]
    assert "masked" not in " ".join(failed(check_run(run_folder(tmp_path / "b", unmasked=UNMASKED_LIMIT), 2, 5)))
    broken = failed(check_run(run_folder(tmp_path / "c", unmasked=1.0), 2, served=5))
    assert broken == ["FAILED: trajectories shown results with nothing kept out of the loss: 100.0% at worst"]
    unseen = failed(check_run(run_folder(tmp_path / "d", unmasked=None), 2, served=5))
    assert unseen == ["FAILED: no trajectory was shown search results, so their masking could not be checked"]
    no_search = failed(check_run(run_folder(tmp_path / "e", searches=0.0), 2, served=5))
    assert no_search == ["FAILED: searches per trajectory, best step: 0.00"]
    no_checkpoint = failed(check_run(run_folder(tmp_path / "f", checkpoint=False), 2, served=5))
    assert len(no_checkpoint) == 1 and no_checkpoint[0].startswith("FAILED: checkpoint ")
    assert failed(check_run(run_folder(tmp_path / "g"), 3, served=5))[0].startswith("FAILED: steps logged")
