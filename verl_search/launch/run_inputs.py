"""Launch checks of what the run loads or reaches: the tools, the retriever, the reward, the model and the GPUs (on a
CPU run: the CPU backend and the memory a tiny-model run needs). Invariant: the only network traffic is one small
``POST /retrieve`` probe per configured retriever URL (and a ``GET /health``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning
from verl_search.launch.gpu_locks import CPU_ENGINES
from verl_search.platform_choice import cpu_requested

#: characters of one passage as the tool shows it (~130 words of wiki-18 plus the title line)
PASSAGE_CHARS = 800
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: resident memory (GB) of a typical process that imports torch + verl + transformers
GB_PER_PROCESS = 0.6
#: processes of a CPU run besides the trainer ranks and their rollout servers: driver, TaskRunner, agent loop, ...
FIXED_PROCESSES = 8


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


def search_config(raw: dict[str, Any], where: str) -> Any:
    """``raw`` validated as the search tool validates its config; ``where`` names it in the error."""
    from verl_search.errors import ConfigError
    from verl_search.tool.config import SearchToolConfig

    try:
        return SearchToolConfig.from_dict(raw)
    except ConfigError as e:
        raise PreflightError(f"{where}: {e}") from e


#: the tool that names a retriever but is not a search tool (its config is AccessToolConfig, checked by verl)
ACCESS_CLASS = "AccessTool"


def search_tool_configs(ctx: LaunchContext) -> list[Any]:
    """The validated :class:`SearchToolConfig` of every tool entry that configures a retriever to search (the access
    tool of a two-tool YAML reads pages from it instead)."""
    where = ctx.rollout.multi_turn.tool_config_path
    entries = [e for e in tool_entries(ctx) if str(e.get("class_name", "")).rpartition(".")[2] != ACCESS_CLASS]
    configs = [dict(entry.get("config") or {}) for entry in entries]
    return [search_config(raw, where) for raw in configs if "retrieval_service_url" in raw]


def retriever_urls(ctx: LaunchContext) -> list[str]:
    """Every /retrieve endpoint the run will call: the search tools' and any ``search:`` block of an agent-loop YAML."""
    configs = search_tool_configs(ctx)
    agent_yaml = ctx.rollout.agent.agent_loop_config_path
    if agent_yaml and Path(agent_yaml).is_file():
        for entry in OmegaConf.to_container(OmegaConf.load(agent_yaml), resolve=True) or []:
            search = entry.get("search") if isinstance(entry, dict) else None
            if isinstance(search, dict):
                configs.append(search_config(search, f"{agent_yaml}: {entry.get('name')}"))
    urls: list[str] = []
    for cfg in configs:
        urls += [u for u in cfg.retrieval_service_url if u not in urls]
    return urls


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
    """The search tool's ``max_result_chars`` fits verl's ``multi_turn.max_tool_response_length``; above it verl cuts
    the text itself, with no log: an error when even one query's passages would be cut, else a warning."""
    multi_turn = ctx.rollout.multi_turn
    limit = int(multi_turn.max_tool_response_length)
    key = "actor_rollout_ref.rollout.multi_turn.max_tool_response_length"
    side = multi_turn.get("tool_response_truncate_side", "middle")
    caps = []
    for cfg in search_tool_configs(ctx):
        cap = cfg.max_result_chars
        caps.append(f"max_result_chars={cap}")
        if cap <= limit:
            continue
        one_query = min(cfg.topk * PASSAGE_CHARS, cap)
        cut = (
            f"{key}={limit} chars < the tool's max_result_chars={cap}: verl cuts the tool's text itself "
            f"(tool_response_truncate_side={side}) with no log"
        )
        fix = f"set {key}>={cap}, or max_result_chars<={limit} in the tool YAML"
        if limit < one_query:
            raise PreflightError(f"{cut}, even one query's {cfg.topk} passages (~{one_query} chars); {fix}")
        raise PreflightWarning(f"{cut} when the model sends several queries; {fix}")
    return f"{limit} chars" + (f" >= the tool's {', '.join(caps)}" if caps else "")


def probe_retriever(url: str, timeout: float) -> str:
    """One real ``POST /retrieve`` in the batch form (``return_scores: true``); a server that rejects it with a
    4xx gets one probe in SkyRL's single-query form. Passes for every server the tool can use, naming the form."""
    import requests

    from verl_search.errors import BadResponse
    from verl_search.tool.wire import FORM_NAMES, batch_body, error_reply, parse_hits, parse_single, single_body

    def post(body: dict) -> requests.Response:
        try:
            return requests.post(url, json=body, timeout=timeout)
        except requests.RequestException as e:
            raise PreflightError(
                f"retriever {url} is unreachable ({type(e).__name__}); start it with "
                "run_scripts/launch_retriever.sh and set RETRIEVER_URL"
            ) from e

    def passages(response: requests.Response, parse: Any) -> int:
        try:
            return len(parse(response.json()))
        except (ValueError, BadResponse) as e:
            raise PreflightError(
                f"retriever {url} answered, but not in the /retrieve shape: {response.text[:200]!r}"
            ) from e

    response = post(batch_body(["preflight probe"], 1))
    if response.status_code == 200:
        hits = passages(response, lambda body: parse_hits(body, 1)[0])
        return f"{url} answered a probe in the {FORM_NAMES['search_r1']} ({hits} passage)"
    if 400 <= response.status_code < 500 and response.status_code != 429:
        single = post(single_body("preflight probe", 1))
        if single.status_code == 200:
            hits = passages(single, parse_single)
            return (
                f"{url} answered a probe in the {FORM_NAMES['skyrl']} ({hits} passage); the tool's default "
                "request_format: auto switches to it"
            )
    kind, _ = error_reply(response.content)
    if kind == "not_cached":  # a web backend replaying a recording that lacks the probe: it answers our protocol
        return f"{url} replays a web search cache (the probe was not recorded: a labelled miss, as the model sees)"
    if kind == "budget_exhausted":
        raise PreflightWarning(
            f"retriever {url}: the web search budget of this run is spent; every search its cache cannot answer will "
            "fail as [search failed: budget] (raise --web_max_live_calls / --web_max_spend, or use a new "
            "--web_budget_scope)"
        )
    raise PreflightError(f"retriever {url} answered HTTP {response.status_code}: {response.text[:200]!r}")


def check_retriever_gpus(ctx: LaunchContext, url: str) -> str:
    """The GPU memory a retriever holds (its ``/health`` ``gpus``) leaves the actor room on the GPUs it shares with
    training: beside the rollout's ``gpu_memory_utilization`` share of each GPU, the retriever may take a quarter of
    what is left (more is a warning) and never half (an error: the FSDP rank on that GPU runs short, and FSDP needs
    the same room on every rank)."""
    import requests

    base = url.rsplit("/retrieve", 1)[0]
    try:
        health = requests.get(f"{base}/health", timeout=ctx.probe_timeout).json()
    except (requests.RequestException, ValueError):
        return f"{base}/health reports no GPU memory; not checked"
    entries = health.get("gpus") if isinstance(health, dict) else None
    if not isinstance(entries, list):
        return f"{base} does not report its GPU memory; not checked"
    held: dict[str, list] = {}  # uuid -> [bytes, total, name]; a fleet lists one entry per replica and GPU
    for entry in entries:
        used = entry.get("process_bytes") if entry.get("process_bytes") is not None else entry.get("reserved_bytes")
        slot = held.setdefault(_uuid(entry.get("uuid")), [0, int(entry.get("total_bytes") or 0), entry.get("name")])
        slot[0] += int(used or 0)
    if not held:
        return f"{base} holds no GPU memory"
    training = ctx.environment.gpu_uuids()
    fraction = float(ctx.rollout.gpu_memory_utilization)
    shared = {u: v for u, v in held.items() if training is None or u in training}
    notes = [f"{_gib(b)} of {_gib(t)} on {n} (not a training GPU)" for u, (b, t, n) in held.items() if u not in shared]
    worst = max(shared.items(), key=lambda item: item[1][0] / max(item[1][1], 1), default=None)
    if worst is None:
        return f"{base}: " + "; ".join(notes)
    uuid, (used, total, name) = worst
    left = (1 - fraction) * total
    where = f"{len(shared)} GPU(s) training also uses" + (
        "" if training is not None else " (assumed: no GPU seen here)"
    )
    summary = f"{base} holds up to {_gib(used)} of {_gib(total)} on {where}"
    if used <= left / 4:
        return f"{summary}; the actor keeps {_gib(left - used)} beside the rollout's {fraction:g}"
    message = (
        f"{summary}: on {name} {uuid} the rollout takes {fraction:g} of the GPU and the FSDP rank keeps "
        f"{_gib(max(left - used, 0))} of the {_gib(left)} left (every rank gets that little room); spread the index "
        "over every GPU (launch_retriever.sh GPUS=all), give the retriever GPUs of its own (GPUS=6,7 there, and "
        "training on the others), or lower GPU_MEMORY_UTILIZATION"
    )
    if used > left / 2 and not ctx.dry_run:
        raise PreflightError(message)
    raise PreflightWarning(message)


def _uuid(value: object) -> str:
    """A GPU's UUID without nvidia-smi's ``GPU-`` prefix (torch writes it without)."""
    return str(value or "?").removeprefix("GPU-")


def _gib(size: float) -> str:
    return f"{size / 1024**3:.1f} GiB"


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
    """A local model folder's tokenizer loads; a hub id loads from the local HF cache, else is only noted."""
    from transformers import AutoTokenizer

    model = ctx.config.actor_rollout_ref.model
    path = str(model.get("tokenizer_path") or model.path)
    if path.startswith("~"):
        raise PreflightError(f"actor_rollout_ref.model.path: {path}: use $HOME or an absolute path, not '~'")
    if not Path(path).exists():
        if not (_HUB_ID.match(path) and not path.startswith((".", "/"))):
            raise PreflightError(
                f"actor_rollout_ref.model.path: {path}: no such folder (and not a hub id like Org/Name)"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception:  # not cached here: verl downloads it on start, nothing to check offline
            return f"{path} is a hub id not in the local cache: verl downloads it on start"
        return f"{path} from the local HF cache ({len(tokenizer)} tokens)"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(model.get("trust_remote_code")))
    except Exception as e:
        raise PreflightError(
            f"actor_rollout_ref.model.path: {path}: tokenizer fails to load ({type(e).__name__})"
        ) from e
    return f"{path} ({len(tokenizer)} tokens)"


def check_gpus(ctx: LaunchContext) -> str:
    """This node sees at least ``trainer.n_gpus_per_node`` CUDA GPUs (a warning in a dry run); on ``trainer.device=cpu``
    the CPU platform and memory are checked instead."""
    import torch

    if str(ctx.config.trainer.device) == "cpu":
        return check_cpu_run(ctx)

    wanted = int(ctx.config.trainer.n_gpus_per_node)
    visible = torch.cuda.device_count()
    if visible < wanted:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ctx.problem(
            f"trainer.n_gpus_per_node={wanted} but this node sees {visible} CUDA GPU(s)"
            + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
        )
    return f"{visible} visible, {wanted} used per node"


def estimated_gb(ranks: int) -> float:
    """Peak resident memory of a tiny-model CPU run with ``ranks`` trainer ranks (two processes per rank)."""
    return GB_PER_PROCESS * (FIXED_PROCESSES + 2 * ranks)


def check_cpu_run(ctx: LaunchContext) -> str:
    """VERL_PLATFORM=cpu, a rollout that runs on a CPU (hf_cpu, vllm from vLLM's CPU build, or sglang from the CPU
    SGLang route), and enough available memory (a warning otherwise)."""
    import psutil

    from verl_search.cpu.options import BACKEND_NAME

    if not cpu_requested():
        raise PreflightError("trainer.device=cpu needs the environment variable VERL_PLATFORM=cpu (the CPU platform)")
    rollout = str(ctx.rollout.name)
    if rollout not in (BACKEND_NAME, *CPU_ENGINES):
        raise PreflightError(
            f"actor_rollout_ref.rollout.name={rollout}: on a CPU use {BACKEND_NAME}, vllm with vLLM's CPU build or "
            "sglang from make install-sglang-cpu"
        )
    if rollout in CPU_ENGINES and ctx.environment.version(CPU_ENGINES[rollout]) is None:
        raise PreflightError(
            f"actor_rollout_ref.rollout.name={rollout} on a CPU needs {CPU_ENGINES[rollout]} installed: run make "
            f"install-{rollout}-cpu and launch with PYTHON=.venv-{rollout}/bin/python"
        )
    ranks = int(ctx.config.trainer.n_gpus_per_node) * int(ctx.config.trainer.nnodes)
    need = estimated_gb(ranks)
    available = psutil.virtual_memory().available / 2**30
    note = f"CPU run, {ranks} rank(s), {os.cpu_count()} cores, {available:.1f} GB available (~{need:.0f} GB needed)"
    if available < need:
        raise PreflightWarning(f"{note}: memory is short, expect swapping or the OOM killer")
    return note
