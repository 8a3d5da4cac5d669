"""The published recipe as a GPU user types it: its launch line passes the preflight (dry run), the run folder follows
the experiment the line names, and every default is the published value or a row of the README's table of
differences (tests/run_scripts/published_recipe.yaml holds the published values). The published line runs whole; the
other launches skip the script's preflight and run it in this process on the printed command (``checked``)."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl_search.launch.preflight import run_preflight
from verl_search.launch.run_outputs import RunRecord, read_record
from verl_search.launch.trainer_config import compose_launch_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_scripts" / "run_qwen2.5-3b_instruct_search_multiturn.sh"
PUBLISHED = yaml.safe_load((Path(__file__).with_name("published_recipe.yaml")).read_text())
#: the published launch line's experiment: trainer.experiment_name=qwen2.5-3b-it_rm-searchR1-like-sgl-multiturn-$(now)
EXPERIMENT = "qwen2.5-3b-it_rm-searchR1-like-sgl-multiturn-{}"
TABLE_HEADING = "### How the defaults differ from the published recipe"
#: a README cell's "—": the published recipe did not set it
UNSET = object()


def write_published_data(home: Path) -> Path:
    """$HOME/data/searchR1_processed_direct as the published preprocessing writes it: train.parquet with more rows than
    one published batch (512), test.parquet and the validation subset, through the real preprocessing script."""
    out = home / "data" / "searchR1_processed_direct"
    out.mkdir(parents=True)
    qa = home / "qa.jsonl"
    with qa.open("w") as f:
        for i in range(540):
            for source in ("nq", "hotpotqa"):
                f.write(
                    json.dumps({"question": f"who is person {i}", "golden_answers": [f"P{i}"], "data_source": source})
                )
                f.write("\n")
    subprocess.run(
        [sys.executable, str(REPO / "data_preprocess" / "preprocess_searchR1_dataset.py"), "--config", "prompt.yaml",
         "--input_jsonl", str(qa), "--splits", "train", "test", "--local_dir", str(out), "--no_progress"],
        cwd=REPO / "data_preprocess", check=True, capture_output=True,
    )  # fmt: skip
    return out


def launch(home: Path, cwd: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    """``bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh OVERRIDES`` from ``cwd`` with DRY_RUN=1, the
    published knobs (none set) and ``env``; no GPU is visible, so attention is chosen as on a node without
    FlashAttention-2."""
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WANDB_API_KEY", "NETRC")}
    full.update(HOME=str(home), PYTHON=sys.executable, DRY_RUN="1", CUDA_VISIBLE_DEVICES="", WANDB_MODE="offline")
    full.update(env)
    return subprocess.run(
        ["bash", str(SCRIPT), *overrides], cwd=cwd, env=full, capture_output=True, text=True, timeout=240
    )


def printed_overrides(stdout: str) -> list[str]:
    """The overrides of the ``command:`` the script printed (shell-quoted, one per line)."""
    command = stdout.split("command:\n", 1)[1].split("DRY_RUN=1")[0]
    words = shlex.split(command.replace("\\\n", " "))
    return words[words.index("verl.trainer.main_ppo") + 1 :]


@pytest.fixture
def checked(preflight_here) -> Callable[..., tuple[subprocess.CompletedProcess, int, str]]:
    """``launch`` with the preflight skipped, then that preflight in this process on the printed command: the script's
    result, the preflight's exit status and its output (no preflight when the script itself failed: status None)."""

    def run(home: Path, cwd: Path, *overrides: str, **env: str) -> tuple[subprocess.CompletedProcess, int | None, str]:
        done = launch(home, cwd, *overrides, SKIP_PREFLIGHT="1", **env)
        if done.returncode != 0:
            return done, None, ""
        return done, *preflight_here(printed_overrides(done.stdout), WANDB_MODE="offline")

    return run


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("home")
    write_published_data(home)
    return home


@pytest.fixture(scope="module")
def published_launch(home, retriever_url, tmp_path_factory):
    """The published launch line (the experiment named at the end), dry-run from a folder of the user's."""
    cwd = tmp_path_factory.mktemp("work")
    name = EXPERIMENT.format("2026-11-28-21-00")
    result = launch(home, cwd, f"trainer.experiment_name={name}", RETRIEVER_URL=retriever_url)
    return result, cwd, name


def test_the_published_launch_line_passes_the_preflight(published_launch):
    result, cwd, name = published_launch
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preflight: passed" in result.stderr
    assert [line for line in result.stderr.splitlines() if "ERROR" in line] == []
    assert f"run folder: {cwd}/runs/{name} " in result.stdout


def test_the_run_folder_and_checkpoints_follow_the_experiment_named_on_the_line(home, retriever_url, tmp_path, checked):
    """Two launches of the published line, two experiment names: two checkpoint folders, two tool configs, two
    metrics files (verl would otherwise resume the first experiment's weights in the second)."""
    folders = []
    for stamp in ("2026-11-28-21-00", "2026-11-28-22-30"):
        name = EXPERIMENT.format(stamp)
        done, code, checks = checked(home, tmp_path, f"trainer.experiment_name={name}", RETRIEVER_URL=retriever_url)
        assert code == 0, done.stdout + done.stderr + checks
        values = dict(o.split("=", 1) for o in printed_overrides(done.stdout) if "=" in o)
        final = {k: v for k, v in values.items() if k.startswith("trainer.")}
        assert final["trainer.default_local_dir"] == f"{tmp_path}/runs/{name}/checkpoints"
        assert final["trainer.validation_data_dir"] == f"{tmp_path}/runs/{name}/val_generations"
        assert f"OK      checkpoint: {tmp_path}/runs/{name}/checkpoints: no checkpoint yet" in checks
        assert (tmp_path / "runs" / name / "search_tool_config.yaml").is_file()
        assert f"per-step metrics: {tmp_path}/runs/{name}/metrics.jsonl" not in done.stdout  # a dry run stops before
        folders.append(final["trainer.default_local_dir"])
    assert folders[0] != folders[1]


def test_the_line_s_experiment_wins_over_the_knob(home, tmp_path):
    done = launch(
        home, tmp_path, "trainer.experiment_name='quoted-name'", EXPERIMENT_NAME="knob-name", SKIP_PREFLIGHT="1"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run folder: {tmp_path}/runs/quoted-name " in done.stdout
    assert not (tmp_path / "runs" / "knob-name").exists()


def readme_table() -> dict[str, tuple[object, object]]:
    """The README's table of differences: setting -> (published value, our value), each cell's first `code` span
    read as YAML."""
    text = (REPO / "README.md").read_text()
    assert TABLE_HEADING in text, "the README has no table of differences from the published recipe"
    section = text.split(TABLE_HEADING, 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue

        def value(cell: str) -> object:
            if cell.startswith("—"):
                return UNSET
            match = re.match(r"`([^`]*)`", cell)
            assert match, f"README table cell without a `value`: {cell!r}"
            return yaml.safe_load(match.group(1))

        rows[cells[0].strip("`")] = (value(cells[1]), value(cells[2]))
    return rows


def same(documented: object, actual: object, names: dict[str, str]) -> bool:
    """A documented value matches an actual one: equal, or (paths) the documented one with its placeholders filled
    in ends the actual one."""
    if isinstance(documented, str) and isinstance(actual, str):
        for placeholder, real in names.items():
            documented = documented.replace(placeholder, real)
        return actual.endswith(documented)
    return documented == actual


def composed_defaults(stdout: str) -> tuple[dict[str, object], dict[str, object]]:
    """verl's config as the printed command composes it (the published keys), and the run's tool config."""
    overrides = printed_overrides(stdout)
    config = compose_launch_config(overrides).config
    verl = {key: OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(config, key)}))["v"]
            for key in PUBLISHED["verl"]}  # fmt: skip
    tool_yaml = yaml.safe_load(Path(str(config.actor_rollout_ref.rollout.multi_turn.tool_config_path)).read_text())
    tool = tool_yaml["tools"][0]
    ours_tool = {"class_name": tool["class_name"], **{f"config.{k}": v for k, v in tool["config"].items()}}
    additions = {
        key: OmegaConf.select(config, key) for key in readme_table() if OmegaConf.select(config, key) is not None
    }
    return {**verl, **{f"tool: {k}": ours_tool.get(k) for k in PUBLISHED["tool"]}}, additions


def test_every_default_is_the_published_value_or_a_row_of_the_readme_table(home, tmp_path):
    """Drift either way is red: a default that moves away from the published value without a row, or a row whose
    values no longer hold. Every knob at its default (RETRIEVER_URL too: no retriever is reached)."""
    done = launch(home, tmp_path, SKIP_PREFLIGHT="1")
    assert done.returncode == 0, done.stdout + done.stderr
    ours, additions = composed_defaults(done.stdout)
    published = {**PUBLISHED["verl"], **{f"tool: {k}": v for k, v in PUBLISHED["tool"].items()}}
    experiment = dict(o.split("=", 1) for o in printed_overrides(done.stdout) if "=" in o)["trainer.experiment_name"]
    ours_names = {"$HOME": str(home), "<experiment>": experiment}
    published_names = {"$HOME": str(home), "<experiment>": PUBLISHED["verl"]["trainer.experiment_name"]}
    published = {k: v.replace("$HOME", str(home)) if isinstance(v, str) else v for k, v in published.items()}
    table = readme_table()

    differing = {key for key, value in published.items() if not same(value, ours[key], {})}
    documented = {key for key, (was, _) in table.items() if was is not UNSET}
    assert differing == documented, (
        f"defaults that differ from the published recipe without a README row: {sorted(differing - documented)}; "
        f"README rows for settings that no longer differ: {sorted(documented - differing)}"
    )
    for key, (was, now) in table.items():
        actual = ours[key] if key in ours else additions.get(key)
        assert same(now, actual, ours_names), f"README row {key}: says `{now}`, the default is {actual!r}"
        if was is not UNSET:
            assert same(was, published[key], published_names), f"README row {key}: says the recipe had `{was}`"


def test_a_launch_records_its_experiment_and_another_one_in_the_same_folder_stops(
    home, retriever_url, tmp_path, monkeypatch, checked
):
    """A run folder fixed by RUN_DIR, shared by two experiments: the second stops before anything is allocated,
    naming both; the first resumes; RESUME_FROM starts from the first's weights on purpose."""
    shared = tmp_path / "shared-run"
    env = {"RETRIEVER_URL": retriever_url, "RUN_DIR": str(shared)}
    first = launch(home, tmp_path, "trainer.experiment_name=first", SKIP_PREFLIGHT="1", **env)
    assert first.returncode == 0, first.stdout + first.stderr
    # what a real launch does once its checks pass (a dry run stops before): the experiment is recorded
    monkeypatch.setenv("WANDB_MODE", "offline")
    findings = run_preflight(printed_overrides(first.stdout), dry_run=True, record_run=True, out=io.StringIO())
    assert [f for f in findings if f.level == "error"] == []
    assert read_record(shared / "checkpoints") == RunRecord("search_r1_like_async_rl", "first")
    (shared / "checkpoints" / "global_step_100" / "actor").mkdir(parents=True)
    (shared / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("100")

    _, code, second = checked(home, tmp_path, "trainer.experiment_name=second", **env)
    assert code == 1
    assert "holds checkpoints of experiment 'first' (global_step_100)" in second
    assert "as experiment 'second'" in second

    _, code, again = checked(home, tmp_path, "trainer.experiment_name=first", **env)
    assert code == 0, again
    assert f"resumes experiment 'first' from {shared}/checkpoints/global_step_100" in again

    resume = {"RESUME_FROM": str(shared / "checkpoints"), "SKIP_PREFLIGHT": "1"}
    on_purpose = launch(home, tmp_path, "trainer.experiment_name=second", **resume, **env)
    assert on_purpose.returncode == 0, on_purpose.stdout + on_purpose.stderr
    overrides = printed_overrides(on_purpose.stdout)
    assert "trainer.resume_mode=resume_path" in overrides
    assert f"trainer.resume_from_path={shared}/checkpoints/global_step_100" in overrides


def test_resume_from_a_folder_without_a_checkpoint_is_a_knob_error(home, tmp_path):
    done = launch(home, tmp_path, RESUME_FROM=str(tmp_path))
    assert done.returncode == 1
    assert f"RESUME_FROM={tmp_path}: {tmp_path}: holds no verl checkpoint" in done.stderr


def test_without_the_preprocessed_data_the_preflight_names_the_command_that_writes_it(retriever_url, tmp_path, checked):
    _, code, checks = checked(tmp_path, tmp_path, RETRIEVER_URL=retriever_url)
    assert code == 1
    folder = tmp_path / "data" / "searchR1_processed_direct"
    for name in ("train.parquet", "val_subset.parquet"):
        assert (
            f"{folder}/{name}: no such file (the preprocessing writes it: python data_preprocess/"
            f"preprocess_searchR1_dataset.py --config data_preprocess/prompt.yaml --local_dir {folder})"
        ) in checks
