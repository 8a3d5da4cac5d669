"""The package layout as users and verl see it: every published command and import path still works after the move
into subpackages, and the import rules each subpackage's docstring states hold (dependencies point one way)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; ``from pkg import mod`` yields ``pkg.mod`` and ``pkg``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _violations(files: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in files:
        for name in sorted(_imports(path)):
            hit = any(name == f or name.startswith(f + ".") for f in forbidden)
            ok = any(name == a or name.startswith(a + ".") for a in allowed)
            if hit and not ok:
                found.append(f"{path.relative_to(REPO)} imports {name}")
    return found


def _py(*parts: str) -> list[Path]:
    base = REPO.joinpath(*parts)
    return sorted(base.rglob("*.py")) if base.is_dir() else [base]


TOOLING = (
    "verl_search.launch",
    "verl_search.eval",
    "verl_search.cpu",
    "verl_search.data",
    "verl_search.demo",
    "verl_search.train",
    "verl_search.testing",
)
TEST_KIT = ("verl_search.testing", "verl_search.demo")

#: old module path -> where it moved; each old path is a forwarding module that still imports (and runs, for CLIs)
MOVED = {
    "verl_search.cpu.stub_retriever": "verl_search.testing.stub_retriever",
    "verl_search.cpu.foreign_retrievers": "verl_search.testing.foreign_retrievers",
    "verl_search.cpu.background_server": "verl_search.testing.background_server",
    "verl_search.cpu.scripted_policy": "verl_search.testing.scripted_policy",
    "verl_search.cpu.scripted_rollout": "verl_search.testing.scripted_rollout",
    "verl_search.cpu.forced_prefix": "verl_search.testing.forced_prefix",
    "verl_search.cpu.tiny_model": "verl_search.train.tiny_model",
    "verl_search.cpu.local_tokenizer": "verl_search.train.local_tokenizer",
    "verl_search.demo": "verl_search.testing.scripted_demo",
}


def _module_file(name: str) -> Path:
    return REPO.joinpath(*name.split(".")).with_suffix(".py")


def test_runtime_plugin_never_imports_the_tooling():
    runtime = [*_py("verl_search", "tool"), *_py("verl_search", "agent_loop.py"), *_py("verl_search", "reward.py")]
    assert _violations(runtime, TOOLING) == []
    # the entry point's one exception: it registers the CPU backend, and only when VERL_PLATFORM=cpu asks
    assert _violations(_py("verl_search", "plugin.py"), TOOLING, allowed=("verl_search.cpu.register",)) == []
    # the trainer-side monitor runs in verl's trainer process: runtime leaves only, never the tooling
    assert _violations(_py("verl_search", "monitor"), TOOLING) == []


def test_neither_the_runtime_plugin_nor_the_cpu_backend_imports_the_test_kit():
    runtime = [
        *_py("verl_search", "tool"),
        *[REPO / "verl_search" / f for f in ("agent_loop.py", "reward.py", "plugin.py")],
    ]
    forwarders = {_module_file(old) for old in MOVED}
    backend = [path for path in _py("verl_search", "cpu") if path not in forwarders]
    expected = {"platform", "rollout", "rollout_server", "sampler", "options", "register", "errors"}
    expected |= {"verl_gaps", "vllm_gaps"}  # the bridges over verl's (and vLLM's) CPU gaps
    expected |= {"checkpoint_engine"}  # weight sync to a separate rollout pool over zmq (the async trainers)
    assert {path.stem for path in backend} == expected | {"__init__"}
    assert _violations([*runtime, *backend], TEST_KIT) == []
    # the CPU backend is the backend alone: the tiny model and the tokenizer are make train's
    assert _violations(backend, ("verl_search.train",)) == []


def test_forwarding_modules_only_forward():
    for old, new in MOVED.items():
        path = _module_file(old)
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert doc.startswith("Forwarding module") and new in doc, f"{path.relative_to(REPO)} is not a forwarder"
        assert _imports(path) <= {"sys", new, new.rpartition(".")[0]}, f"{path.relative_to(REPO)} does more"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_paths_expose_the_same_names(old):
    moved = importlib.import_module(MOVED[old])
    forwarded = importlib.import_module(old)
    public = {name for name in vars(moved) if not name.startswith("_")}
    assert public and public <= set(dir(forwarded))
    assert all(getattr(forwarded, name) is getattr(moved, name) for name in public)


def test_shared_leaves_import_nothing_of_ours():
    names = ("errors", "protocol", "atomic", "import_hook", "platform_choice", "jsonl")
    leaves = [REPO / "verl_search" / f"{name}.py" for name in names]
    assert _violations(leaves, ("verl_search", "local_dense_retriever")) == []


def test_retrieval_service_uses_only_the_shared_leaves_of_the_plugin():
    service = _py("local_dense_retriever")
    allowed = ("verl_search.protocol", "verl_search.atomic")
    assert _violations(service, ("verl_search", "verl"), allowed) == []


def test_every_subpackage_says_what_it_holds_and_may_import():
    for init in [
        *REPO.joinpath("verl_search").rglob("__init__.py"),
        *REPO.joinpath("local_dense_retriever").rglob("__init__.py"),
    ]:
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "import" in doc, f"{init.relative_to(REPO)} lacks a docstring stating its import rules"


def test_public_imports_resolve():
    import verl_search
    from verl_search import SearchTool, SearchToolConfig, compute_score, run_search, search_stats
    from verl_search.reward import compute_score as reward_fn

    assert SearchTool.__module__ == "verl_search.tool.search_tool"
    assert SearchToolConfig().topk >= 1 and callable(run_search) and isinstance(search_stats(), dict)
    assert compute_score is reward_fn and set(verl_search.__all__) >= {"SearchTool", "compute_score"}


def test_reward_path_resolves_through_verls_loader():
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object("pkg://verl_search.reward", "compute_score")
    out = fn("searchR1_nq", "<answer>Paris</answer>", {"target": ["Paris"]})
    assert out["score"] == 1.0


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "verl_search.report", "--help"],
        ["-m", "verl_search.preflight", "--help"],
        ["-m", "verl_search.cpu.tiny_model", "--help"],
        ["-m", "verl_search.train.tiny_model", "--help"],
        ["-m", "verl_search.cpu.stub_retriever", "--help"],
        ["-m", "verl_search.testing.stub_retriever", "--help"],
        ["-m", "verl_search.demo", "--help"],
        ["-m", "verl_search.testing.scripted_demo", "--help"],
        ["-m", "local_dense_retriever.toy_corpus", "--help"],
        ["-m", "local_dense_retriever.serve", "--help"],
        ["local_dense_retriever/retrieval_server.py", "--help"],
        ["local_dense_retriever/download.py", "--help"],
        ["local_dense_retriever/build_index.py", "--help"],
    ],
    ids=lambda argv: " ".join(argv[:-1]),
)
def test_published_commands_still_run(argv, tmp_path):
    """Each command users type (module or script path) starts and prints its flags; run from outside the checkout for
    module paths so the installed package, not the working directory, answers."""
    cwd = REPO if argv[0].endswith(".py") else tmp_path
    res = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage:" in res.stdout and "--" in res.stdout


def test_published_flags_survive_the_move():
    flags = {
        "local_dense_retriever/download.py": ["--save_path", "--bm25"],
        "local_dense_retriever/build_index.py": ["--corpus_path", "--retriever_model"],
    }
    for script, wanted in flags.items():
        res = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, check=True)
        assert all(flag in res.stdout for flag in wanted), script


def test_console_and_plugin_entry_points_load():
    scripts = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.name.startswith("verl-search-")}
    if not scripts:
        pytest.skip("package not installed")
    assert set(scripts) == {
        "verl-search-retriever",
        "verl-search-preprocess",
        "verl-search-download",
        "verl-search-report",
    }
    for ep in scripts.values():
        assert callable(ep.load()), ep.value
    plugin = {ep.name: ep for ep in entry_points(group="verl.plugins")}["verl_search"]
    assert plugin.load().__name__ == "verl_search.plugin"


#: the package's only paths above its own folder, each with what it is for
CHECKOUT_PATHS = {
    # the shipped YAMLs: a checkout's top-level files first, the wheel's copies second
    "verl_search/resources.py": "_PACKAGE.parent",
    # the folder verl_search is imported from, put on the stages' PYTHONPATH (site-packages for a wheel)
    "verl_search/train/processes.py": "parents[2]",
    # the GPU/CPU lock files, which only a checkout has: the preflight says "not checked" without them
    "verl_search/launch/gpu_locks.py": "parents[2]",
    # the checkout eval_search.sh runs from, named in its hint for making a missing validation file
    "verl_search/launch/eval_run.py": "parents[2]",
    # make gpu-smoke runs the checkout's run script, retriever and preprocessing (a checkout command, like make)
    "verl_search/launch/gpu_smoke.py": "parents[2]",
}


def test_the_package_needs_no_checkout_beyond_the_documented_paths():
    """An installed wheel runs make train's pipeline: no module reaches for repository files by walking up from its
    own path, except the listed ones, which have a fallback."""
    found = []
    for path in _py("verl_search"):
        rel = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            walks_up = any(marker in code for marker in ("parents[", ".parent.parent", "_PACKAGE.parent"))
            if walks_up and not (rel in CHECKOUT_PATHS and CHECKOUT_PATHS[rel] in code):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], "modules that need the repository checkout:\n" + "\n".join(found)
