"""The repository's top-level files the package reads (the shipped tool YAMLs, the prompt templates, the launch
preflight's version locks), found by one locator that works from a checkout and from an installed wheel.

Invariant: the top-level files are the source of truth; a wheel carries copies ``setup.py`` makes under
``verl_search/_shipped/``. Standard library only: ``setup.py`` reads :data:`SHIPPED` from this file.
"""

from __future__ import annotations

from pathlib import Path

#: the files, by their path relative to the repository root (and to ``_shipped/`` in a wheel)
SEARCH_TOOL_YAML = "tool_config/search_tool_config.yaml"
SEARCH_ACCESS_TOOL_YAML = "tool_config/search_access_tool_config.yaml"
AGENT_LOOP_YAML = "tool_config/search_r1_agent.yaml"
PROMPT_YAML = "data_preprocess/prompt.yaml"
SHIPPED = (SEARCH_TOOL_YAML, SEARCH_ACCESS_TOOL_YAML, AGENT_LOOP_YAML, PROMPT_YAML)
#: the folder of the copies inside the installed package
SHIPPED_DIR = "_shipped"
#: the folder of the version locks (``make lock``) and the lock files in it that ship, as glob patterns
LOCK_DIR = "requirements"
LOCK_PATTERNS = ("gpu-*.txt", "cpu-*.txt")
#: a file only a checkout has: the preprocessing script users run from its root
PREPROCESS_SCRIPT = "data_preprocess/preprocess_searchR1_dataset.py"

_PACKAGE = Path(__file__).resolve().parent


def shipped_file(name: str) -> Path:
    """The path of the shipped file ``name``: the checkout's top-level file, else the copy installed with the package
    (``ResourceMissing`` naming where it looked when neither exists)."""
    if name not in SHIPPED:
        raise KeyError(f"{name!r} is not a shipped file ({', '.join(SHIPPED)})")
    places = [_PACKAGE.parent / name, _PACKAGE / SHIPPED_DIR / name]
    for path in places:
        if path.is_file():
            return path
    from verl_search.errors import ResourceMissing

    raise ResourceMissing(
        f"{name} is neither in a checkout nor in the installed package (looked in {', '.join(map(str, places))}); "
        "reinstall verl-search"
    )


def checkout_root() -> Path | None:
    """The repository checkout this package runs from, or None for an installed wheel."""
    root = _PACKAGE.parent
    return root if (root / PREPROCESS_SCRIPT).is_file() else None


def lock_folder() -> Path:
    """The folder of the version locks: the checkout's ``requirements/``, else the copies installed with the package
    (the folder may be missing from a wheel built without them; the lock readers say so)."""
    root = checkout_root()
    return root / LOCK_DIR if root is not None else _PACKAGE / SHIPPED_DIR / LOCK_DIR
