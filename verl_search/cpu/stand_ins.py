"""Import-time stand-ins for packages that are absent here but that a few modules of an engine import unconditionally
(names they use only on hardware this machine lacks).

Invariant: a stand-in is served only to the imports written in the modules named for it, and leaves ``sys.modules``
once each of those modules has run, so every other importer (``importlib.util.find_spec`` included) still sees the
package as absent; calling any name of a stand-in raises ``RuntimeError`` naming it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


class Unavailable:
    """What a stand-in module holds for every name: calling it says that the package is absent."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is not installed here (an import-time stand-in of verl_search.cpu)")


class _StandInModule(ModuleType):
    def __getattr__(self, attr: str) -> Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self.__name__}.{attr}")


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return _StandInModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []  # any submodule is served too


def _importer_name() -> str | None:
    """The ``__name__`` of the module whose code runs the import being resolved (the first frame outside importlib)."""
    frame = sys._getframe(2)  # past find_spec
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
        frame = frame.f_back
    return None if frame is None else frame.f_globals.get("__name__")


class _RemovingStandIns(importlib.abc.Loader):
    """Runs one importer's real loader, then takes the stand-ins it imported out of ``sys.modules``."""

    def __init__(self, inner: importlib.abc.Loader, before: Callable[[], None]) -> None:
        self.inner = inner
        self.before = before

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.before()
        try:
            self.inner.exec_module(module)
        finally:
            for name in [name for name, held in sys.modules.items() if isinstance(held, _StandInModule)]:
                del sys.modules[name]


class StandIns(importlib.abc.MetaPathFinder):
    """Serves each absent package of ``stand_ins`` (and its submodules) to the imports written in its importers alone,
    and wraps those importers' loaders so that the stand-ins leave ``sys.modules`` once each has run; ``before`` runs
    ahead of each importer."""

    def __init__(self, stand_ins: Mapping[str, frozenset[str]], before: Callable[[], None] = lambda: None) -> None:
        self.stand_ins = dict(stand_ins)
        self.importers = frozenset().union(*self.stand_ins.values())
        self.before = before

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if fullname in self.importers:
            return self._wrapped(fullname)
        importers = self.stand_ins.get(fullname.partition(".")[0])
        if importers is not None and _importer_name() in importers:
            return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)
        return None

    def _wrapped(self, fullname: str) -> Any:
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _RemovingStandIns(spec.loader, self.before)
        return spec
