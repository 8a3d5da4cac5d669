"""What the launch preflight may ask about the installed Python environment: package versions and requirements,
whether a module imports, the interpreter's version, the newest CUDA the node's NVIDIA driver supports, whether
transformers can use FlashAttention-2, the GPUs a run would use. :class:`InstalledEnvironment` answers for the
running interpreter; tests hand the preflight any other object with the same methods (the seam), so no check patches
a function.

Invariant: asking never installs, downloads or writes anything; a failed import is an answer, not an exception.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Protocol

#: nvidia-smi's header names the newest CUDA version the driver supports ("... CUDA Version: 12.4 |")
_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


class PythonEnvironment(Protocol):
    """The questions the preflight asks about the environment a run will use."""

    def python(self) -> str:
        """``major.minor`` of the interpreter."""
        ...

    def version(self, distribution: str) -> str | None:
        """The installed version of a distribution (``torch``), or None when it is not installed."""
        ...

    def requires(self, distribution: str) -> list[str] | None:
        """The requirements an installed distribution declares (its metadata), or None when it is not installed."""
        ...

    def cuda_driver(self) -> str | None:
        """The newest CUDA version the NVIDIA driver supports (``12.4``, as nvidia-smi prints it), or None when no
        driver answers."""
        ...

    def import_error(self, module: str) -> str | None:
        """None when ``module`` imports; otherwise the one-line reason it does not."""
        ...

    def flash_attention_2(self) -> str | None:
        """None when transformers finds FlashAttention-2 usable; otherwise why not, in a few words."""
        ...

    def gpu_uuids(self) -> set[str] | None:
        """The UUIDs (no ``GPU-`` prefix) of the CUDA GPUs a run started here would use, or None when none is seen."""
        ...


class InstalledEnvironment:
    """The running interpreter's environment (importlib.metadata and real imports)."""

    def python(self) -> str:
        return f"{sys.version_info[0]}.{sys.version_info[1]}"

    def version(self, distribution: str) -> str | None:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    def requires(self, distribution: str) -> list[str] | None:
        try:
            return metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:
            return None

    def cuda_driver(self) -> str | None:
        """nvidia-smi's ``CUDA Version``; without it, what a CUDA build of torch reads from the driver."""
        smi = shutil.which("nvidia-smi")
        if smi is not None:
            try:
                printed = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                printed = ""
            if match := _SMI_CUDA.search(printed):
                return match.group(1)
        if importlib.util.find_spec("torch") is None:
            return None
        import torch

        driver_version = getattr(torch._C, "_cuda_getDriverVersion", None)  # CUDA builds only; 0 without a driver
        try:
            found = driver_version() if driver_version is not None else 0
        except RuntimeError:
            return None
        return f"{found // 1000}.{found % 1000 // 10}" if found else None

    def import_error(self, module: str) -> str | None:
        try:
            importlib.import_module(module)
        except Exception as e:  # engines fail to import with many types (ImportError, OSError for CUDA libs, ...)
            text = str(e).strip().splitlines()
            return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
        return None

    def flash_attention_2(self) -> str | None:
        from verl_search.launch.attention import flash_attention_2_problem

        return flash_attention_2_problem()

    def gpu_uuids(self) -> set[str] | None:
        import torch

        if not torch.cuda.is_available():
            return None
        props = (torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count()))
        return {str(p.uuid).removeprefix("GPU-") for p in props}
