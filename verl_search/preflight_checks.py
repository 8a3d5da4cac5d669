"""The individual launch checks: each returns a one-line note when fine and raises a typed problem otherwise.

Invariant: no check starts a GPU job, downloads anything or writes a file; the only network traffic is one small
``POST /retrieve`` probe per configured retriever URL.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl_search.errors import SearchError

#: columns every training/validation parquet needs (DESIGN §3.5); ``agent_name`` is optional for verl
REQUIRED_COLUMNS = ("prompt", "data_source", "reward_model")
#: characters of one passage as the tool shows it (~130 words of wiki-18 plus the title line)
PASSAGE_CHARS = 800
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class PreflightError(SearchError):
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

    @property
    def rollout(self) -> DictConfig:
        return self.config.actor_rollout_ref.rollout


def as_list(value: Any) -> list[str]:
    """A verl ``*_files`` value (a string or a list) as a list of strings."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


@lru_cache(maxsize=32)
def read_data_file(path: str) -> DataFileInfo:
    """Row count, columns and agent names of a parquet file, reading only the metadata and one column."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if path.startswith("~"):
        raise PreflightError(f"{path}: verl does not expand '~' in data paths; use $HOME or an absolute path")
    if not Path(path).is_file():
        raise PreflightError(f"{path}: no such file")
    if not path.endswith(".parquet"):
        raise PreflightError(f"{path}: not a .parquet file (verl-search data is parquet; see data_preprocess/)")
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
        with contextlib.redirect_stdout(io.StringIO()):
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
            omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise PreflightError(
            f"verl rejects the config: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e
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

    default = str(ctx.rollout.agent.default_agent_loop)
    wanted = {default}
    for path in as_list(ctx.config.data.train_files) + as_list(ctx.config.data.val_files):
        with contextlib.suppress(PreflightError):  # a bad file is reported by its own check
            info = read_data_file(path)
            wanted.update(info.agent_names)
            if ctx.expected_agent and info.agent_names and set(info.agent_names) != {ctx.expected_agent}:
                raise PreflightError(
                    f"{path}: rows ask for agent {', '.join(info.agent_names)} but the launch asks for "
                    f"{ctx.expected_agent}; re-run data_preprocess with the matching --template or change AGENT"
                )
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


def tool_entries(ctx: LaunchContext) -> list[dict[str, Any]]:
    """The raw ``tools:`` entries of the configured tool YAML."""
    path = ctx.rollout.multi_turn.tool_config_path
    if not path:
        raise PreflightError("actor_rollout_ref.rollout.multi_turn.tool_config_path is not set: the model has no tools")
    if not Path(path).is_file():
        raise PreflightError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {path}: no such file")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    tools = raw.get("tools") if isinstance(raw, dict) else None
    if not isinstance(tools, list) or not tools:
        raise PreflightError(f"{path}: no 'tools:' list")
    return tools


def search_tool_configs(ctx: LaunchContext) -> list[Any]:
    """The validated :class:`SearchToolConfig` of every tool entry that configures a retriever."""
    from verl_search.config import SearchToolConfig
    from verl_search.errors import ConfigError

    configs = []
    for entry in tool_entries(ctx):
        raw = dict(entry.get("config") or {})
        if "retrieval_service_url" in raw:
            try:
                configs.append(SearchToolConfig.from_dict(raw))
            except ConfigError as e:
                raise PreflightError(f"{ctx.rollout.multi_turn.tool_config_path}: {e}") from e
    return configs


def check_tools_build(ctx: LaunchContext) -> str:
    """verl builds every tool of the YAML, as each rollout worker will."""
    from verl.tools.tool_registry import initialize_tools_from_config

    path = ctx.rollout.multi_turn.tool_config_path
    tool_entries(ctx)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
            tools = initialize_tools_from_config(path)
    except Exception as e:
        raise PreflightError(f"{path}: verl cannot build the tools ({type(e).__name__}: {e})") from e
    return f"{path}: " + ", ".join(f"{t.name} ({type(t).__module__}.{type(t).__name__})" for t in tools)


def check_tool_response_length(ctx: LaunchContext) -> str:
    """verl cuts tool text at ``multi_turn.max_tool_response_length`` chars (default 256); it must fit the results."""
    limit = int(ctx.rollout.multi_turn.max_tool_response_length)
    key = "actor_rollout_ref.rollout.multi_turn.max_tool_response_length"
    for cfg in search_tool_configs(ctx):
        if limit < cfg.topk * PASSAGE_CHARS:
            raise PreflightError(
                f"{key}={limit} chars cuts one query's {cfg.topk} passages (~{cfg.topk * PASSAGE_CHARS} chars); "
                f"set it to the tool's max_result_chars ({cfg.max_result_chars})"
            )
        if limit < cfg.max_result_chars:
            raise PreflightWarning(
                f"{key}={limit} < the tool's max_result_chars={cfg.max_result_chars}: multi-query results get cut"
            )
    return f"{limit} chars"


def probe_retriever(url: str, timeout: float) -> str:
    """One real ``POST /retrieve`` with the §3.1 body; the answer must have the §3.1 shape."""
    import requests
    from pydantic import ValidationError

    from verl_search.protocol import RetrieveResponse

    body = {"queries": ["preflight probe"], "topk": 1, "return_scores": False}
    try:
        response = requests.post(url, json=body, timeout=timeout)
    except requests.RequestException as e:
        raise PreflightError(
            f"retriever {url} is unreachable ({type(e).__name__}); start it with "
            "run_scripts/launch_retriever.sh and set RETRIEVER_URL"
        ) from e
    if response.status_code != 200:
        raise PreflightError(f"retriever {url} answered HTTP {response.status_code}: {response.text[:200]!r}")
    try:
        parsed = RetrieveResponse.model_validate(response.json())
    except (ValueError, ValidationError) as e:
        raise PreflightError(
            f"retriever {url} answered, but not in the /retrieve shape: {response.text[:200]!r}"
        ) from e
    if len(parsed.result) != 1:
        raise PreflightError(f"retriever {url} returned {len(parsed.result)} result lists for 1 query")
    return f"{url} answered a probe ({len(parsed.result[0])} passage)"


def check_reward(ctx: LaunchContext) -> str:
    """The custom reward loads exactly as verl loads it, and scores a sample answer with verl's signature."""
    from verl.utils.import_utils import load_extern_object

    spec = ctx.config.reward.custom_reward_function
    if not spec.path:
        return "verl's built-in scorer for each data_source"
    path, name = str(spec.path), str(spec.name or "compute_score")
    key = "reward.custom_reward_function"
    try:
        fn = load_extern_object(module_path=path, object_name=name)
    except FileNotFoundError as e:
        raise PreflightError(f"{key}.path: {path}: no such file") from e
    except AttributeError as e:
        raise PreflightError(f"{key}.name: {path} defines no '{name}'") from e
    except Exception as e:
        cause = e.__cause__ or e
        raise PreflightError(f"{key}.path: {path} fails to import ({type(cause).__name__}: {cause})") from e
    if not callable(fn):
        raise PreflightError(f"{key}.name: {path}:{name} is not callable")
    kwargs = dict(spec.get("reward_kwargs") or {})
    try:
        score = fn(
            data_source="searchR1_nq",
            solution_str="<answer>Paris</answer>",
            ground_truth={"target": ["Paris"]},
            extra_info={},
            **kwargs,
        )
    except Exception as e:
        raise PreflightError(f"reward {path}:{name} raised on a sample answer ({type(e).__name__}: {e})") from e
    value = score.get("score") if isinstance(score, dict) else score
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PreflightError(f"reward {path}:{name} returned {score!r}; expected a number or a dict with 'score'")
    return f"{path}:{name} (sample answer scored {value:g})"


def check_tokenizer(ctx: LaunchContext) -> str:
    """A local model folder's tokenizer loads; a hub id is noted (verl downloads it at start)."""
    model = ctx.config.actor_rollout_ref.model
    path = str(model.get("tokenizer_path") or model.path)
    if path.startswith("~"):
        raise PreflightError(f"actor_rollout_ref.model.path: {path}: use $HOME or an absolute path, not '~'")
    if not Path(path).exists():
        if _HUB_ID.match(path) and not path.startswith((".", "/")):
            return f"{path} is a hub id: not checked here (verl downloads it on start)"
        raise PreflightError(f"actor_rollout_ref.model.path: {path}: no such folder (and not a hub id like Org/Name)")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model.get("trust_remote_code")))
    except Exception as e:
        raise PreflightError(
            f"actor_rollout_ref.model.path: {path}: tokenizer fails to load ({type(e).__name__})"
        ) from e
    return f"{path} ({len(tokenizer)} tokens)"


def check_checkpoint(ctx: LaunchContext) -> str:
    """With ``resume_mode=resume_path``, the checkpoint folder exists and holds the actor."""
    trainer = ctx.config.trainer
    if trainer.resume_mode != "resume_path":
        return f"resume_mode={trainer.resume_mode}"
    path = str(trainer.resume_from_path)
    if "global_step_" not in path:
        raise PreflightError(f"trainer.resume_from_path={path}: must be a .../global_step_N folder")
    if not (Path(path) / "actor").is_dir():
        raise PreflightError(f"trainer.resume_from_path={path}: no actor/ folder (not a verl checkpoint)")
    return path


def check_gpus(ctx: LaunchContext) -> str:
    """This node sees at least ``trainer.n_gpus_per_node`` CUDA GPUs (a warning in a dry run)."""
    import torch

    wanted = int(ctx.config.trainer.n_gpus_per_node)
    visible = torch.cuda.device_count()
    if visible < wanted:
        cls = PreflightWarning if ctx.dry_run else PreflightError
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise cls(
            f"trainer.n_gpus_per_node={wanted} but this node sees {visible} CUDA GPU(s)"
            + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
        )
    return f"{visible} visible, {wanted} used per node"
