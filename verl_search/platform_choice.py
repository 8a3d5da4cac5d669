"""Which verl platform this process was asked for: ``VERL_PLATFORM=cpu`` selects the CPU backend (the one reading of
that variable). Invariant: a shared leaf that reads the environment only, so the plugin can ask on every ``import
verl`` without loading the CPU backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: the environment variable verl reads to pick its platform, and the value that selects ours
VARIABLE = "VERL_PLATFORM"
CPU = "cpu"


def cpu_requested(env: Mapping[str, str] | None = None) -> bool:
    """True when this process was asked to run verl on the CPU platform (case and blanks ignored); ``env`` defaults
    to ``os.environ`` as it is at the call."""
    return (os.environ if env is None else env).get(VARIABLE, "").strip().lower() == CPU
