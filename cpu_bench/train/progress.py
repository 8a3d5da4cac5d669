"""The line ``make train`` and ``make demo`` print before each stage: its number, what it does, and how long it is
expected to take, from the stage's size and the pace measured on two CPU cores.

The pace is ``make demo``'s on a fresh clone on two cores at the default model size (docs/results/training.md):
another CPU or model size runs at another pace, so the line says "about". A stage that is already finished is
reused at once, and its own line says so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from cpu_bench.train.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pace:
    """Seconds per unit of work on two CPU cores at the default model size."""

    retriever_start: float = 25.0  # the embedded retriever: MiniLM, the toy corpus's flat index
    data: float = 10.0
    base_per_step: tuple[float, float, float] = (0.09, 0.19, 0.23)  # copying, language, trajectory steps
    sft_start: float = 15.0
    sft_per_step: float = 0.52
    trainer_start: float = 45.0  # Ray, verl's workers, the rollout server
    grpo_per_step: float = 26.0
    validation: float = 15.0  # the held-out questions, decoded greedily


PACE = Pace()


def base_model_seconds(config: TrainConfig, pace: Pace = PACE) -> float:
    p = config.pretrain
    copy, language, trajectories = pace.base_per_step
    return 30.0 + copy * p.copy_steps + language * p.lm_steps + trajectories * p.task_steps


def sft_seconds(rows: int, config: TrainConfig, epochs: int, pace: Pace = PACE) -> float:
    return pace.sft_start + pace.sft_per_step * math.ceil(rows / config.sft.batch_size) * epochs


def grpo_seconds(config: TrainConfig, val_only: bool = False, pace: Pace = PACE) -> float:
    if val_only:
        return pace.trainer_start + pace.validation
    validations = 1 + config.grpo.steps // config.grpo.test_freq + (config.grpo.steps % config.grpo.test_freq > 0)
    return pace.trainer_start + pace.grpo_per_step * config.grpo.steps + pace.validation * validations


def duration(seconds: float) -> str:
    """``about 40 s`` below a minute and a half, else ``about 4 min``."""
    return f"about {round(seconds / 5) * 5:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


class Progress:
    """Numbers the stages of one run (``total`` of them) and logs one line as each starts."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def stage(self, name: str, what: str, seconds: float | None) -> None:
        self.done += 1
        expected = f" ({duration(seconds)} on 2 CPU cores)" if seconds is not None else ""
        logger.info("[%d/%d] %s: %s%s", self.done, self.total, name, what, expected)


def stage_count(config: TrainConfig) -> int:
    """Retriever and data, base model, SFT, (the no-search baseline,) GRPO."""
    return 5 if config.baseline else 4
