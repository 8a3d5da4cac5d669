"""The package layout as users and verl see it: the published commands and import paths work, the wheel holds the
runtime plugin and the tooling but not the CPU test bench, modules that moved are moved (no forwarders), no module
imports itself back through others, and the import rules each subpackage's docstring states hold (dependencies point
one way)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from setuptools import find_packages

REPO = Path(__file__).resolve().parents[1]
#: the packages of the repository: the wheel's two and the CPU test bench, which stays in the checkout
ROOTS = ("verl_search", "cpu_bench", "local_dense_retriever")


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


def _modules() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of :data:`ROOTS` (a package under its own name)."""
    found = {}
    for path in [p for root in ROOTS for p in _py(root)]:
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that can run: all of them but the bodies of ``if TYPE_CHECKING:`` blocks (type-only
    imports, the usual way to name a type without importing its module)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in {getattr(test, "id", None), getattr(test, "attr", None)}:
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, at module level or inside functions (relative imports resolved;
    ``from pkg import name`` is ``pkg.name`` when that is a module, else ``pkg``)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.add(full if full in modules else source)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _subpackage(module: str) -> str:
    """The unit of the package-level graph: a first-level subpackage (``cpu_bench.train``), else the module itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and REPO.joinpath(*parts[:2]).is_dir() else module


MODULES = _modules()
GRAPH = _import_graph(MODULES)
PACKAGE_GRAPH: dict[str, set[str]] = {}
for _module, _targets in GRAPH.items():
    _unit = _subpackage(_module)
    PACKAGE_GRAPH.setdefault(_unit, set()).update(u for u in map(_subpackage, _targets) if u != _unit)


TOOLING = ("verl_search.launch", "verl_search.eval", "verl_search.cpu", "verl_search.data", "cpu_bench")


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    source = "import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ndef f():\n    import d\n"
    imported = {n.names[0].name for n in _runtime_nodes(ast.parse(source)) if isinstance(n, ast.Import)}
    assert imported == {"a", "c", "d"}


@pytest.mark.parametrize("root", ROOTS)
def test_no_import_cycles(root):
    """No module imports itself back through others, and no subpackage does (module-level and function-level
    imports both: a cycle through a function-level import is one edit away from an import-time failure; imports
    under ``if TYPE_CHECKING:`` never run and do not count)."""
    mine = [c for c in _cycles(GRAPH) if any(m.split(".")[0] == root for m in c)]
    mine += [c for c in _cycles(PACKAGE_GRAPH) if any(m.split(".")[0] == root for m in c)]
    assert mine == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in mine)


def test_verl_search_never_imports_the_cpu_bench():
    assert _violations(_py("verl_search"), ("cpu_bench",)) == []
    # the graph too (relative imports and ``from pkg import name`` resolved)
    assert [
        m for m, ts in GRAPH.items() if m.startswith("verl_search") and any(t.startswith("cpu_bench") for t in ts)
    ] == []


def _setup_call(name: str) -> ast.Call:
    """The call named ``name`` (``find_packages``, ``setup``) in setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]
    assert len(calls) == 1, f"setup.py calls {name} {len(calls)} times"
    return calls[0]


def test_the_wheel_holds_no_cpu_bench_module():
    """setup.py's own ``find_packages(...)`` arguments, run on this tree: the wheel's packages; no package data or
    sdist rule reaches into the bench (its shipped base model included)."""
    kwargs = {k.arg: ast.literal_eval(k.value) for k in _setup_call("find_packages").keywords}
    packages = find_packages(where=str(REPO), **kwargs)
    assert {"verl_search", "verl_search.cpu", "verl_search.launch", "local_dense_retriever"} <= set(packages)
    assert [p for p in packages if p.split(".")[0] not in ("verl_search", "local_dense_retriever")] == []
    setup = {k.arg: k.value for k in _setup_call("setup").keywords}
    package_data = ast.literal_eval(setup["package_data"])
    assert set(package_data) <= {"verl_search", "local_dense_retriever"}
    assert not [f for files in package_data.values() for f in files if "shipped_base_model" in f or "train/" in f]
    assert "cpu_bench" not in (REPO / "MANIFEST.in").read_text(encoding="utf-8")


FORWARDER = re.compile(r"^\s*sys\.modules\[__name__\]\s*=", re.MULTILINE)
#: the one module-level ``__getattr__`` kept: the package root's lazy exports, which are published names (the tool
#: YAMLs' ``verl_search.SearchTool`` and ``verl_search.AccessTool``, ``from verl_search import compute_score``)
LAZY_EXPORTS = {"SearchTool", "run_search", "SearchToolConfig", "AccessTool", "run_access", "AccessToolConfig"}
LAZY_EXPORTS |= {"compute_score"}


@pytest.mark.parametrize("root", ["verl_search", "cpu_bench"])
def test_no_forwarding_modules_or_getattr_reexports(root):
    """A module that moved is moved: no module stands in for another under an old path, and no module-level
    ``__getattr__`` hands out names that live elsewhere (the package root's published lazy exports excepted)."""
    found = []
    for path in _py(root):
        rel = str(path.relative_to(REPO))
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        if (ast.get_docstring(tree) or "").startswith("Forwarding module") or FORWARDER.search(source):
            found.append(f"{rel}: a forwarding module")
        getattrs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
        if getattrs and rel != "verl_search/__init__.py":
            found.append(f"{rel}: a module-level __getattr__")
    assert found == []
    import verl_search

    assert set(verl_search._LAZY) == LAZY_EXPORTS and LAZY_EXPORTS <= set(verl_search.__all__)


def test_runtime_plugin_never_imports_the_tooling():
    runtime = [*_py("verl_search", "tool"), *_py("verl_search", "agent_loop.py"), *_py("verl_search", "reward.py")]
    assert _violations(runtime, TOOLING) == []
    # the entry point's one exception: it registers the CPU backend, and only when VERL_PLATFORM=cpu asks
    assert _violations(_py("verl_search", "plugin.py"), TOOLING, allowed=("verl_search.cpu.register",)) == []
    # the trainer-side monitor runs in verl's trainer process: runtime leaves only, never the tooling
    assert _violations(_py("verl_search", "monitor"), TOOLING) == []


def test_the_cpu_backend_is_the_backend_alone():
    """verl_search/cpu holds the platform, the rollout backend and their bridges; the tiny model, the tokenizer and
    the test kit are the bench's."""
    backend = _py("verl_search", "cpu")
    expected = {"platform", "rollout", "rollout_server", "sampler", "options", "register"}
    expected |= {"verl_gaps", "vllm_gaps", "sglang_gaps", "stand_ins"}  # the bridges over verl's and engines' CPU gaps
    expected |= {"checkpoint_engine"}  # weight sync to a separate rollout pool over zmq (the async trainers)
    assert {path.stem for path in backend} == expected | {"__init__"}
    assert _violations(backend, ("cpu_bench", "verl_search.launch", "verl_search.data", "verl_search.eval")) == []


def test_inside_the_bench_the_test_kit_may_use_the_pipeline_but_not_the_reverse():
    assert _violations(_py("cpu_bench", "train"), ("cpu_bench.testing",)) == []
    assert _violations(_py("cpu_bench", "background_server.py"), ("cpu_bench", "verl_search")) == []


def test_shared_leaves_import_nothing_of_ours():
    names = ("errors", "protocol", "atomic", "pacing", "import_hook", "platform_choice", "jsonl")
    leaves = [REPO / "verl_search" / f"{name}.py" for name in names]
    assert _violations(leaves, ("verl_search", "local_dense_retriever", "cpu_bench")) == []


def test_retrieval_service_uses_only_the_shared_leaves_of_the_plugin():
    service = _py("local_dense_retriever")
    allowed = ("verl_search.protocol", "verl_search.atomic", "verl_search.pacing")
    assert _violations(service, ("verl_search", "verl", "cpu_bench"), allowed) == []


def test_every_subpackage_says_what_it_holds_and_may_import():
    for init in [init for root in ROOTS for init in REPO.joinpath(root).rglob("__init__.py")]:
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


#: where users and make find ``python -m`` commands of ours
COMMAND_FILES = ("Makefile", "run_scripts/*.sh", "requirements/*.sh")
COMMAND = re.compile(r"-m ((?:verl_search|cpu_bench|local_dense_retriever)(?:\.\w+)*)")


def test_every_module_the_scripts_and_make_run_exists():
    named = {
        (str(path.relative_to(REPO)), module)
        for pattern in COMMAND_FILES
        for path in REPO.glob(pattern)
        for module in COMMAND.findall(path.read_text(encoding="utf-8"))
    }
    assert {module for _, module in named} >= {"cpu_bench.train", "verl_search.launch.preflight"}
    missing = [
        f"{where}: python -m {module}" for where, module in sorted(named) if not importlib.util.find_spec(module)
    ]
    assert missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "verl_search.report", "--help"],
        ["-m", "verl_search.launch.preflight", "--help"],
        ["-m", "cpu_bench.train", "--help"],
        ["-m", "cpu_bench.train.tiny_model", "--help"],
        ["-m", "cpu_bench.testing.stub_retriever", "--help"],
        ["-m", "cpu_bench.testing.scripted_demo", "--help"],
        ["-m", "local_dense_retriever.toy.corpus", "--help"],
        ["-m", "local_dense_retriever.serve", "--help"],
        ["local_dense_retriever/retrieval_server.py", "--help"],
        ["local_dense_retriever/download.py", "--help"],
        ["local_dense_retriever/build_index.py", "--help"],
    ],
    ids=lambda argv: " ".join(argv[:-1]),
)
def test_published_commands_still_run(argv, tmp_path):
    """Each command users type (module or script path) starts and prints its flags. The wheel's modules run from
    outside the checkout, so the installed package, not the working directory, answers; scripts and the CPU test
    bench run from the checkout, where they live."""
    in_checkout = argv[0].endswith(".py") or argv[1].startswith("cpu_bench")
    cwd = REPO if in_checkout else tmp_path
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
    # the GPU/CPU lock files, which only a checkout has: the preflight says "not checked" without them
    "verl_search/launch/gpu_locks.py": "parents[2]",
}


def test_the_package_needs_no_checkout_beyond_the_documented_paths():
    """An installed wheel runs the plugin and the tooling: no module reaches for repository files by walking up from
    its own path, except the listed ones, which have a fallback."""
    found = []
    for path in _py("verl_search"):
        rel = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            walks_up = any(marker in code for marker in ("parents[", ".parent.parent", "_PACKAGE.parent"))
            if walks_up and not (rel in CHECKOUT_PATHS and CHECKOUT_PATHS[rel] in code):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], "modules that need the repository checkout:\n" + "\n".join(found)
