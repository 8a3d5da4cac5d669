"""verl plugin entry point (group ``verl.plugins``): makes ``import verl`` register the ``search_r1_agent`` loop, the
``search_*`` trainer modes (:mod:`verl_search.monitor.trainer`), the CPU backend (:mod:`verl_search.cpu.register`)
only when ``VERL_PLATFORM=cpu``, and a bridge over a verl 0.9.1 bug on every platform.

verl loads this module at the end of ``import verl`` in every process and silently skips a plugin that raises.
Invariants: importing it is cheap (each registration waits, through a one-shot import hook, for verl to import the
module concerned) and it never raises (failures are logged).

The bug: ``PPOTrainerSeparateAsync._setup`` passes ``print``'s ``flush=True`` to ``logger.info``, which ``logging``
refuses, so that trainer dies before its first step; while verl's source has it (:func:`has_bug`), that module gets a
logger that drops ``flush``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import MutableMapping
from types import ModuleType
from typing import Any

from verl_search.import_hook import after_import
from verl_search.platform_choice import cpu_requested

logger = logging.getLogger(__name__)

AGENT_NAME = "search_r1_agent"
AGENT_TARGET = "verl_search.agent_loop.SearchR1AgentLoop"
REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"
TRAINER_MODULE = "verl.trainer.ppo.v1"
SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"
SUPPORTED_VERL = "0.9."


def register_agent_loop(module: ModuleType) -> None:
    """Add ``search_r1_agent`` to verl's agent-loop registry (the class itself is imported only when used)."""
    module._agent_loop_registry.setdefault(AGENT_NAME, {"_target_": AGENT_TARGET})


def register_trainers(module: ModuleType) -> None:
    """Add the ``search_*`` trainer modes (verl's V1 trainers logging per-step search metrics) to verl's registry."""
    from verl_search.monitor.trainer import register_search_trainers

    register_search_trainers(module)


class _NoFlushLogger(logging.LoggerAdapter):
    """The module's own logger, minus ``print``'s ``flush`` keyword."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs.pop("flush", None)
        return msg, kwargs

    def setLevel(self, level: int | str) -> None:  # noqa: N802 (logging's name)
        self.logger.setLevel(level)


def has_bug(module: ModuleType) -> bool:
    """Whether ``module`` (verl's trainer_separate_async) logs with ``flush=`` in ``PPOTrainerSeparateAsync._setup``."""
    source = inspect.getsource(module.PPOTrainerSeparateAsync._setup)
    return "logger.info(" in source and "flush=True" in source


def fix_separate_async(module: ModuleType) -> None:
    """Give verl's separate_async module a logger that accepts ``flush`` (idempotent; only on 0.9.x with the bug)."""
    from importlib.metadata import version

    if isinstance(module.logger, _NoFlushLogger) or not version("verl").startswith(SUPPORTED_VERL):
        return
    if has_bug(module):
        module.logger = _NoFlushLogger(module.logger, {})


def install() -> None:
    """Register now if verl's modules are loaded, else when each is first imported (idempotent)."""
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
