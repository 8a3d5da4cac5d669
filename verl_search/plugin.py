"""verl plugin entry point (group ``verl.plugins``): makes ``import verl`` register the ``search_r1_agent`` loop, the
``search_*`` trainer modes (:mod:`verl_search.monitor.trainer`), a fix for a verl 0.9.1 bug of its separate_async
trainer (:mod:`verl_search.verl_fixes`), and the CPU backend (:mod:`verl_search.cpu.register`)
only when ``VERL_PLATFORM=cpu``.

verl loads this module at the end of ``import verl`` in every process, Ray workers included, and silently skips a
plugin that raises. Invariants: importing it is cheap (it imports nothing heavy: the registration happens when verl's
agent-loop module is imported, through a one-shot import hook) and it never raises (failures are logged).
"""

from __future__ import annotations

import logging
from types import ModuleType

from verl_search.import_hook import after_import
from verl_search.platform_choice import cpu_requested

logger = logging.getLogger(__name__)

AGENT_NAME = "search_r1_agent"
AGENT_TARGET = "verl_search.agent_loop.SearchR1AgentLoop"
REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"
TRAINER_MODULE = "verl.trainer.ppo.v1"
SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"


def register_agent_loop(module: ModuleType) -> None:
    """Add ``search_r1_agent`` to verl's agent-loop registry (the class itself is imported only when used)."""
    module._agent_loop_registry.setdefault(AGENT_NAME, {"_target_": AGENT_TARGET})


def register_trainers(module: ModuleType) -> None:
    """Add the ``search_*`` trainer modes (verl's V1 trainers logging per-step search metrics) to verl's registry."""
    from verl_search.monitor.trainer import register_search_trainers

    register_search_trainers(module)


def fix_separate_async(module: ModuleType) -> None:
    """Bridge verl 0.9.1's separate_async logging bug (:mod:`verl_search.verl_fixes`)."""
    from verl_search.verl_fixes import fix_separate_async_logger

    fix_separate_async_logger(module)


def install() -> None:
    """Register now if verl's agent-loop and trainer modules are loaded, else when each is first imported.
    Idempotent."""
    after_import(REGISTRY_MODULE, register_agent_loop)
    after_import(TRAINER_MODULE, register_trainers)
    after_import(SEPARATE_ASYNC_MODULE, fix_separate_async)


try:
    install()
except Exception:  # noqa: BLE001 - an entry point must never raise into `import verl`
    logger.exception("verl_search: plugin setup failed; the %s agent loop is not registered", AGENT_NAME)

if cpu_requested():
    try:
        from verl_search.cpu.register import install as install_cpu_backend

        install_cpu_backend()
    except Exception:  # noqa: BLE001 - an entry point must never raise into `import verl`; say why loudly
        logger.exception("verl_search: the CPU backend (VERL_PLATFORM=cpu) could not be registered")
