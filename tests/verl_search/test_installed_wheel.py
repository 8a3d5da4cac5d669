"""The package runs without the repository checkout: a wheel built from this tree carries the top-level files the
package reads (the tool YAMLs, prompt.yaml, the version locks) unchanged and no CPU test bench, and from a folder
outside the checkout the installed copy finds them, writes a run's tool YAML and RL rows, compares with the locks
and names the preprocessing command it has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from verl_search import resources

REPO = Path(__file__).resolve().parents[2]


def _locks(root: Path) -> list[Path]:
    return sorted(path for pattern in resources.LOCK_PATTERNS for path in (root / resources.LOCK_DIR).glob(pattern))


def test_the_checkout_reads_the_top_level_files_in_place():
    for name in resources.SHIPPED:
        assert resources.shipped_file(name) == REPO / name
    assert resources.checkout_root() == REPO and resources.lock_folder() == REPO / resources.LOCK_DIR


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of this tree, installed alone (no dependencies, no checkout) into a folder."""
    wheels, target = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)], check=True)
    (wheel,) = wheels.glob("verl_search-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def test_the_wheel_carries_each_shipped_file_unchanged(installed):
    for name in resources.SHIPPED:
        copy = installed / "verl_search" / resources.SHIPPED_DIR / name
        assert copy.read_bytes() == (REPO / name).read_bytes(), name
    locks = _locks(REPO)
    assert len(locks) >= 14  # the GPU locks of both engines, both CUDA majors, three Pythons; the CPU routes'
    for lock in locks:
        copy = installed / "verl_search" / resources.SHIPPED_DIR / lock.relative_to(REPO)
        assert copy.read_bytes() == lock.read_bytes(), lock.name


def test_the_installed_package_writes_a_runs_inputs_outside_the_checkout(installed, tmp_path):
    """From a folder outside the checkout, with only the installed copy and the environment's dependencies on the
    path: the locator finds the shipped files, the retriever is a module, the tool-YAML writer and the preprocessing
    work, and the CPU test bench is not there."""
    script = textwrap.dedent(
        f"""
        import importlib.util, json
        from pathlib import Path
        import yaml
        import verl_search
        from verl_search import resources
        from verl_search.data.pipeline import PreprocessConfig, run_preprocess
        from verl_search.launch.tool_yaml import write_tool_config
        from verl_search.launch.checks import preprocess_command
        from verl_search.launch.gpu_locks import DEFAULT_LOCK_DIR, load_lock
        out = Path({str(tmp_path)!r})
        tool_yaml = write_tool_config(
            resources.shipped_file(resources.SEARCH_TOOL_YAML), out / "search_tool_config.yaml",
            "http://127.0.0.1:1/retrieve", {{"topk": 1}},
        )
        qa = out / "qa.jsonl"
        row = {{"id": "q0", "question": "who?", "golden_answers": ["a"], "data_source": "nq"}}
        qa.write_text(json.dumps(row) + "\\n")
        config = PreprocessConfig(
            template_file=resources.shipped_file(resources.PROMPT_YAML), template="search_r1", input_jsonl=qa,
            splits=("test",), local_dir=out / "rl",
        )
        list(run_preprocess(config, progress=False))
        print(json.dumps({{
            "package": verl_search.__file__,
            "files": [str(resources.shipped_file(n)) for n in resources.SHIPPED],
            "retriever": importlib.util.find_spec("local_dense_retriever.retrieval_server").origin,
            "bench": importlib.util.find_spec("cpu_bench") is not None,
            "yaml": tool_yaml.read_text(),
            "schemas": [t["tool_schema"]["function"]["name"] for t in yaml.safe_load(tool_yaml.read_text())["tools"]],
            "parquet": (out / "rl" / "test.parquet").is_file(),
            "checkout": resources.checkout_root(),
            "locks": str(DEFAULT_LOCK_DIR),
            "torch": load_lock("vllm", "3.11", cuda="12")["torch"],
            "preprocess": preprocess_command(),
        }}))
        """
    )
    site = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), site])}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["package"].startswith(str(installed))  # the installed copy, not the checkout
    assert all(path.startswith(str(installed)) for path in seen["files"])
    assert seen["retriever"].startswith(str(installed))
    assert not seen["bench"] and not (installed / "cpu_bench").exists()  # make train and the test kit stay behind
    assert "retrieval_service_url: http://127.0.0.1:1/retrieve" in seen["yaml"]
    assert seen["schemas"] == ["search"] and seen["parquet"]
    # the preflight's lock check reads the wheel's copies, and the hint for missing data names the console script
    assert seen["checkout"] is None and seen["locks"].startswith(str(installed))
    assert seen["torch"] == _pin(REPO / resources.LOCK_DIR / "gpu-vllm-cu12-py3.11.txt", "torch")
    prompt = installed / "verl_search" / resources.SHIPPED_DIR / resources.PROMPT_YAML
    assert seen["preprocess"] == f"verl-search-preprocess --config {prompt}"


def _pin(lock: Path, package: str) -> str:
    line = next(line for line in lock.read_text().splitlines() if line.startswith(f"{package}=="))
    return line.split("==", 1)[1].split()[0]


def test_a_missing_shipped_file_is_a_typed_error_naming_where_it_looked(monkeypatch, tmp_path):
    from verl_search.errors import ResourceMissing, VerlSearchError

    monkeypatch.setattr(resources, "_PACKAGE", tmp_path / "verl_search")
    with pytest.raises(ResourceMissing, match="looked in") as caught:
        resources.shipped_file(resources.PROMPT_YAML)
    assert isinstance(caught.value, VerlSearchError)
