"""What the launch preflight may ask about the installed Python environment (:class:`InstalledEnvironment`, for the
running interpreter); tests hand the preflight any other object with the same methods (the seam), so no check
patches a function.

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

#: nvidia-smi's header names the newest CUDA version the driver supports ("... CUDA Version: 12.4 |")
_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


class InstalledEnvironment:
    """The running interpreter's environment (importlib.metadata and real imports)."""

    def python(self) -> str:
        """``major.minor`` of the interpreter."""
        return f"{sys.version_info[0]}.{sys.version_info[1]}"

    def version(self, distribution: str) -> str | None:
        """The installed version of a distribution (``torch``), or None when it is not installed."""
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    def requires(self, distribution: str) -> list[str] | None:
        """The requirements an installed distribution declares, or None when it is not installed."""
        try:
            return metadata.requires(distribution) or []
        except metadata.PackageNotFoundError:
            return None

    def cuda_driver(self) -> str | None:
        """The newest CUDA the NVIDIA driver supports (nvidia-smi's ``CUDA Version``, e.g. ``12.4``; without it, what a
        CUDA build of torch reads from the driver), or None when no driver answers."""
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
        """None when ``module`` imports; otherwise the one-line reason it does not."""
        try:
            importlib.import_module(module)
        except Exception as e:  # engines fail to import with many types (ImportError, OSError for CUDA libs, ...)
            text = str(e).strip().splitlines()
            return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
        return None

    def flash_attention_2(self) -> str | None:
        """None when transformers reports FlashAttention-2 usable here (package, version and a CUDA device), else why
        not, in a few words (without flash_attn's package there is nothing to ask: transformers is not imported)."""
        if importlib.util.find_spec("flash_attn") is None:
            return "flash-attn is not installed"
        try:
            from transformers.utils import is_flash_attn_2_available
        except ImportError as e:
            return f"transformers does not import ({e})"
        if is_flash_attn_2_available():
            return None
        return "transformers finds no usable FlashAttention-2 (a flash_attn without FA2 kernels, or no CUDA device)"

    def gpu_uuids(self) -> set[str] | None:
        """The UUIDs (no ``GPU-`` prefix) of the CUDA GPUs a run started here would use, or None when none is seen."""
        import torch

        if not torch.cuda.is_available():
            return None
        props = (torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count()))
        return {str(p.uuid).removeprefix("GPU-") for p in props}
