"""The import-time stand-ins: served only to the modules named for them, gone once those have run."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from verl_search.cpu.stand_ins import StandIns

ABSENT = "vs_absent_pkg"


@pytest.fixture
def importers(tmp_path, monkeypatch):
    """Two modules that import the absent package at import time, and one that guards the import as usual."""
    (tmp_path / "vs_importer_a.py").write_text(
        f"import {ABSENT}.io as tio\nfrom {ABSENT}.transforms.functional import Mode\nSEEN = tio\n"
    )
    (tmp_path / "vs_importer_b.py").write_text(f"from {ABSENT} import thing\n")
    (tmp_path / "vs_bystander.py").write_text(
        f"try:\n    import {ABSENT}\nexcept ImportError:\n    {ABSENT} = None\nHAS = {ABSENT} is not None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    finder = StandIns({ABSENT: frozenset({"vs_importer_a", "vs_importer_b"})}, before=lambda: calls.append(1))
    sys.meta_path.insert(0, finder)
    yield calls, finder
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n.startswith(("vs_importer", "vs_bystander", ABSENT))]:
        del sys.modules[name]


def test_a_named_importer_imports_and_the_package_stays_absent_for_everyone_else(importers):
    module = importlib.import_module("vs_importer_a")
    importlib.import_module("vs_importer_b")
    assert importers[0] == [1, 1]  # ``before`` ran ahead of each importer
    assert not [name for name in sys.modules if name.startswith(ABSENT)]
    assert importlib.util.find_spec(ABSENT) is None
    assert importlib.import_module("vs_bystander").HAS is False
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(ABSENT)
    with pytest.raises(RuntimeError, match=rf"{ABSENT}\.io\.decode is not installed here"):
        module.SEEN.decode(b"")


def test_without_the_finder_the_importer_fails_as_it_would_upstream(importers):
    sys.meta_path.remove(importers[1])
    with pytest.raises(ModuleNotFoundError, match=ABSENT):
        importlib.import_module("vs_importer_b")
