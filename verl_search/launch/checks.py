"""Launch checks of the config and the data (verl settings, parquet files, agent loops), plus the types all checks
share. Invariant: data files are read through their metadata and one column.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl_search.errors import VerlSearchError
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.gpu_locks import DEFAULT_LOCK_DIR
from verl_search.resources import PREPROCESS_SCRIPT, PROMPT_YAML, checkout_root, shipped_file

#: the files data_preprocess/preprocess_searchR1_dataset.py writes by default, and the command that writes them
PREPROCESSED_FILES = ("train.parquet", "test.parquet", "val_subset.parquet")
#: columns every training/validation parquet needs; ``agent_name`` is optional for verl
REQUIRED_COLUMNS = ("prompt", "data_source", "reward_model")


def preprocess_command() -> str:
    """The preprocessing command as a user types it: the checkout's script (from the checkout's root), else the
    installed console script with the shipped prompt.yaml."""
    if checkout_root() is not None:
        return f"python {PREPROCESS_SCRIPT} --config {PROMPT_YAML}"
    return f"verl-search-preprocess --config {shipped_file(PROMPT_YAML)}"


class PreflightError(VerlSearchError):
    """A launch problem; the message is the one line shown to the user."""

    kind = "preflight"


class PreflightWarning(PreflightError):
    """A problem that does not stop the launch (or only stops a real launch, see the GPU check)."""

    kind = "preflight_warning"


@dataclass(frozen=True)
class DataFileInfo:
    """What the preflight learned from one parquet file."""

    rows: int
    columns: tuple[str, ...]
    agent_names: tuple[str, ...] = field(default=())


@dataclass
class LaunchContext:
    """The composed verl config plus the launcher's intent."""

    config: DictConfig
    dry_run: bool = False
    expected_agent: str | None = None
    probe_timeout: float = 10.0
    #: where installed versions and importability come from (tests pass a fake environment)
    environment: InstalledEnvironment = field(default_factory=InstalledEnvironment)
    #: the folder with the GPU locks the installed versions are compared with
    lock_dir: Path = DEFAULT_LOCK_DIR

    @property
    def rollout(self) -> DictConfig:
        return self.config.actor_rollout_ref.rollout

    def problem(self, message: str) -> PreflightError:
        """An error for a real launch; a warning in a dry run (the machine checked may not be the one that trains)."""
        return PreflightWarning(message) if self.dry_run else PreflightError(message)


def as_list(value: Any) -> list[str]:
    """A verl ``*_files`` value (a string or a list) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


def data_agents(ctx: LaunchContext) -> dict[str, tuple[str, ...]]:
    """The agent names each readable train and validation file's rows ask for (a bad file is reported by its own
    check)."""
    agents: dict[str, tuple[str, ...]] = {}
    for path in as_list(ctx.config.data.train_files) + as_list(ctx.config.data.val_files):
        try:
            agents[path] = read_data_file(path).agent_names
        except PreflightError:
            continue
    return agents


def wanted_agents(ctx: LaunchContext) -> set[str]:
    """Every agent loop the run needs: the default one and those the data rows name."""
    return {str(ctx.rollout.agent.default_agent_loop), *(a for names in data_agents(ctx).values() for a in names)}


def read_data_file(path: str) -> DataFileInfo:
    """Row count, columns and agent names of a parquet file, reading only the metadata and one column (remembered
    while the file's size and modification time stay the same)."""
    if path.startswith("~"):
        raise PreflightError(f"{path}: verl does not expand '~' in data paths; use $HOME or an absolute path")
    if not Path(path).is_file():
        made = Path(path).name in PREPROCESSED_FILES
        hint = f" (the preprocessing writes it: {preprocess_command()} --local_dir {Path(path).parent})" if made else ""
        raise PreflightError(f"{path}: no such file{hint}")
    if not path.endswith(".parquet"):
        raise PreflightError(f"{path}: not a .parquet file (verl-search data is parquet; see data_preprocess/)")
    stat = Path(path).stat()
    return _read_parquet(path, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _read_parquet(path: str, size: int, mtime_ns: int) -> DataFileInfo:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        columns = tuple(parquet.schema_arrow.names)
        agents: tuple[str, ...] = ()
        if "agent_name" in columns:
            table = pq.read_table(path, columns=["agent_name"])
            agents = tuple(sorted(str(a) for a in pc.unique(table.column("agent_name")).to_pylist()))
    except Exception as e:  # pyarrow raises several types for a damaged or foreign file
        raise PreflightError(f"{path}: cannot be read as parquet ({type(e).__name__}: {e})") from e
    return DataFileInfo(rows=parquet.metadata.num_rows, columns=columns, agent_names=agents)


def check_data_file(ctx: LaunchContext, path: str, role: str) -> str:
    """The file exists, loads, has the needed columns and enough rows for one batch."""
    info = read_data_file(path)
    needed = (ctx.config.data.get("prompt_key", "prompt"), *REQUIRED_COLUMNS[1:])
    missing = [c for c in needed if c not in info.columns]
    if missing:
        raise PreflightError(f"{path}: missing column(s) {', '.join(missing)}; run data_preprocess/ first")
    if info.rows == 0:
        raise PreflightError(f"{path}: has no rows")
    batch = int(ctx.config.data.train_batch_size)
    if role == "train" and info.rows < batch:
        raise PreflightError(f"{path}: {info.rows} rows < data.train_batch_size={batch}; not one step would run")
    return f"{path} ({info.rows} rows)"


def check_rollout_engine(ctx: LaunchContext) -> str:
    """``rollout.name`` + ``mode`` name an engine this verl has (``sglang_async`` is gone)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    name, mode = ctx.rollout.name, ctx.rollout.mode
    if (name, mode) not in _ROLLOUT_REGISTRY:
        known = ", ".join(f"name={n} mode={m}" for n, m in sorted(_ROLLOUT_REGISTRY))
        raise PreflightError(f"actor_rollout_ref.rollout: name={name} mode={mode} is not a verl rollout ({known})")
    return f"{name} ({mode})"


def check_tool_parser(ctx: LaunchContext) -> str:
    """``multi_turn.format`` names a registered tool-call parser (``qwen`` is not one; Qwen2.5 uses hermes)."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    fmt = ctx.rollout.multi_turn.format
    if fmt not in ToolParser._registry:
        known = ", ".join(sorted(ToolParser._registry))
        raise PreflightError(
            f"actor_rollout_ref.rollout.multi_turn.format={fmt} is not a tool parser ({known}); Qwen2.5 uses hermes"
        )
    return str(fmt)


def check_verl_validation(ctx: LaunchContext) -> str:
    """verl's own start-up validation (batch sizes divisible by GPUs, micro-batch settings, sampling)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = ctx.config
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Disabled critic as algorithm.adv_estimator != gae" and the like
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
            omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise PreflightError(
            f"verl rejects the config: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e
    trainer = config.trainer
    if trainer.get("val_only", False) and not trainer.get("val_before_train", True):
        raise PreflightError("trainer.val_only=True needs trainer.val_before_train=True: otherwise verl trains instead")
    return "batch sizes and sampling settings pass verl's checks"


def registered_agent_loops(ctx: LaunchContext) -> dict[str, str]:
    """Agent loop name → class path, as an agent-loop worker would see them (plugins, decorators, YAML file)."""
    import verl  # noqa: F401  (loads the verl.plugins entry points, as every Ray worker does)
    import verl.experimental.agent_loop  # noqa: F401  (registers single_turn_agent and tool_agent)
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    loops = {name: str(entry.get("_target_", "?")) for name, entry in _agent_loop_registry.items()}
    path = ctx.rollout.agent.agent_loop_config_path
    if path:
        if not Path(path).is_file():
            raise PreflightError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path: {path}: no such file")
        for entry in OmegaConf.load(path):
            loops[str(entry.name)] = str(entry.get("_target_", "?"))
    return loops


def check_agent_loops(ctx: LaunchContext) -> str:
    """Every agent the data asks for (and the default) is registered and importable, and matches the intent."""
    from hydra.utils import get_class

    for path, agents in data_agents(ctx).items():
        if ctx.expected_agent and agents and set(agents) != {ctx.expected_agent}:
            raise PreflightError(
                f"{path}: rows ask for agent {', '.join(agents)} but the launch asks for "
                f"{ctx.expected_agent}; re-run data_preprocess with the matching --template or change AGENT"
            )
    wanted = wanted_agents(ctx)
    loops = registered_agent_loops(ctx)
    for name in sorted(wanted):
        if name not in loops:
            raise PreflightError(f"agent loop '{name}' is not registered (registered: {', '.join(sorted(loops))})")
        try:
            get_class(loops[name])
        except Exception as e:
            raise PreflightError(f"agent loop '{name}': cannot import {loops[name]} ({e})") from e
    if wanted == {"single_turn_agent"}:
        raise PreflightError("every row uses single_turn_agent, which never calls tools; set the default agent loop")
    return ", ".join(sorted(wanted))
