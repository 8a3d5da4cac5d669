"""A bridge over a verl 0.9.1 bug on every platform: ``PPOTrainerSeparateAsync._setup`` (``trainer.v1.trainer_mode=
separate_async`` with ``actor_rollout_ref.hybrid_engine=False``, i.e. ``TRAINER=one_step_off|fully_async``) calls
``logger.info(..., flush=True)``, a keyword of ``print`` that ``logging`` refuses (``TypeError: Logger._log() got an
unexpected keyword argument 'flush'``), so the trainer dies before its first step. The bridge gives that module a logger
that drops ``flush``; everything else is logged unchanged.

Applied by the plugin when verl imports the module, only to a verl whose source still has the bug (checked by
:func:`has_bug`, so a fixed verl is left alone); ``tests/verl_search/test_verl_fixes.py`` fails once upstream changes.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import MutableMapping
from types import ModuleType
from typing import Any

SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"
SUPPORTED_VERL = "0.9."


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


def fix_separate_async_logger(module: ModuleType) -> None:
    """Give verl's separate_async module a logger that accepts ``flush`` (idempotent; only on 0.9.x with the bug)."""
    from importlib.metadata import version

    if isinstance(module.logger, _NoFlushLogger) or not version("verl").startswith(SUPPORTED_VERL):
        return
    if has_bug(module):
        module.logger = _NoFlushLogger(module.logger, {})
