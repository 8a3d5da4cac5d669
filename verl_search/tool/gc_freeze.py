"""Keep Python's garbage collector off the objects a rollout worker made before it started searching.

A verl rollout worker has imported torch, transformers, verl and their dependencies before it builds the tool:
hundreds of thousands of objects that live as long as the process. Every full collection walks all of them, and the
allocations of HTTP calls trigger collections often, so the worker's HTTP clients lose a large share of their
throughput to the collector (docs/results/tool.md has the figures).
``gc.freeze()`` moves the objects alive at that moment to a permanent generation the collector skips; objects made
afterwards are collected as before.

Invariant: frozen at most once per process, by the first tool (or native loop) whose config asks for it
(``gc_freeze``, off by default: it changes the whole process's collector); the cost is that cyclic garbage among the
frozen start-up objects is never freed.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

_frozen = False


def freeze_startup_objects() -> bool:
    """``gc.freeze()`` once per process (True when this call froze)."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()  # what is garbage now is freed first, not frozen forever
    gc.freeze()
    logger.debug("gc: %d start-up objects frozen", gc.get_freeze_count())
    return True
