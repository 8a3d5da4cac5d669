"""Run a function on a module right after it is imported (or now, if it already is), without importing it early.

Invariant: the wrapped loader runs the module's real loader first; a callback that raises leaves the module imported
and logs why; each finder handles one module name once, then removes itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

Callback = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callback) -> None:
        self.inner = inner
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            self.callback(module)
        except Exception:  # noqa: BLE001 - the import itself succeeded; say what was not applied
            logger.exception("verl_search: post-import hook for %s failed", module.__name__)


def pending(name: str) -> bool:
    """True while a hook for module ``name`` waits for its import."""
    return any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # what the other finders say, this one gone
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.callback)
        return spec


def after_import(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module ``name`` is imported; immediately if it already is."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        callback(loaded)
        return
    if not pending(name):
        sys.meta_path.insert(0, _AfterImport(name, callback))
