"""Run verl's real agent loops (``AgentLoopWorker.generate_sequences``) on CPU with a scripted "model".

For tests and the demo; NO LANGUAGE MODEL RUNS: see :mod:`cpu_bench.testing.scripted_policy`. The trainer config is
verl's own generated PPO config with dotted overrides merged in struct mode, so a misspelt key is an error, and rows
are batched the way ``RLHFDataset`` + ``collate_fn`` batch them. Invariant: what comes back is what verl produced
(padding removed), plus every generate call the scripted server saw.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from cpu_bench.testing.scripted_policy import GenerateCall, Policy, ScriptedServerManager
from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir

ScoreFn = Callable[..., Any]  # verl's compute_score(data_source, solution_str, ground_truth, extra_info=None)


def verl_trainer_config(overrides: Sequence[str] = ()) -> DictConfig:
    """verl's default PPO trainer config (its generated YAML) with ``key=value`` overrides; unknown keys raise."""
    import verl

    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(path)
    OmegaConf.set_struct(config, True)
    return OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))


def rollout_overrides(
    *,
    model_path: str | os.PathLike,
    tool_config_path: str | os.PathLike | None = None,
    agent_loop_config_path: str | os.PathLike | None = None,
    max_turns: int = 4,
    prompt_length: int = 2048,
    response_length: int = 1024,
    max_tool_response_length: int = 8192,
    rollout_name: str = "vllm",
    calculate_log_probs: bool = True,
) -> list[str]:
    """The overrides a Search-R1 run sets (multi-turn on, hermes, tool YAML, turn limit, lengths).

    ``max_tool_response_length`` (characters) stays above the tool's ``max_result_chars`` so verl never cuts results.
    """
    prefix = "actor_rollout_ref.rollout"
    out = [
        f"actor_rollout_ref.model.path={model_path}",
        f"{prefix}.name={rollout_name}",
        f"{prefix}.prompt_length={prompt_length}",
        f"{prefix}.response_length={response_length}",
        f"{prefix}.calculate_log_probs={calculate_log_probs}",
        f"{prefix}.multi_turn.enable=true",
        f"{prefix}.multi_turn.format=hermes",
        f"{prefix}.multi_turn.max_assistant_turns={max_turns}",
        f"{prefix}.multi_turn.max_tool_response_length={max_tool_response_length}",
        f"{prefix}.trace.backend=null",
        "data.max_prompt_length=" + str(prompt_length),
        "data.max_response_length=" + str(response_length),
    ]
    if tool_config_path is not None:
        out.append(f"{prefix}.multi_turn.tool_config_path={tool_config_path}")
    if agent_loop_config_path is not None:
        out.append(f"{prefix}.agent.agent_loop_config_path={agent_loop_config_path}")
    return out


def rows_to_batch(rows: Sequence[Mapping[str, Any]], agent_name: str | None = None) -> Any:
    """Preprocessed rows (``prompt``, ``data_source``, ``reward_model``, ``extra_info``, ``agent_name``) → DataProto,
    with the fields ``RLHFDataset.__getitem__`` adds (``raw_prompt``, ``index``, ``tools_kwargs``...) for text rows."""
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    if not rows:
        raise ValueError("rows is empty")
    items = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if not isinstance(prompt, (list, tuple, np.ndarray)) or not all(isinstance(m, Mapping) for m in prompt):
            raise ValueError(f"row {i} needs 'prompt' as a list of chat messages")
        item = dict(row)
        extra = dict(item.get("extra_info") or {})
        item["extra_info"] = extra
        item["raw_prompt"] = [dict(m) for m in prompt]  # parquet readers give numpy arrays; verl's loops want lists
        item["index"] = extra.get("index", i)
        item["tools_kwargs"] = extra.get("tools_kwargs", {})
        item["interaction_kwargs"] = extra.get("interaction_kwargs", {})
        if agent_name is not None:
            item["agent_name"] = agent_name
        elif "agent_name" not in item:
            raise ValueError(f"row {i} has no 'agent_name' and no agent_name was given")
        item["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
        items.append(item)
    return DataProto.from_single_dict(collate_fn(items))


@dataclass
class Trajectory:
    """One row's rollout as verl produced it, padding removed."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    response_text: str  # decoded like verl's reward path: special tokens skipped
    num_turns: int
    extra_fields: dict[str, Any]  # the row's non-tensor batch fields, the loop's extra_fields included
    metrics: dict[str, Any]  # the loop's AgentLoopMetrics (generate_sequences / tool_calls seconds, num_preempted)
    score: Any = None


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    calls: list[GenerateCall]  # every generate call, in order
    batch: Any  # the DataProto returned by AgentLoopWorker.generate_sequences


def _unpad(batch: Any, i: int, tokenizer: Any, non_tensor: Mapping[str, Any]) -> Trajectory:
    prompts, responses = batch.batch["prompts"][i], batch.batch["responses"][i]
    attention = batch.batch["attention_mask"][i]
    prompt_valid = attention[: prompts.shape[0]].bool()
    response_valid = attention[prompts.shape[0] :].bool()
    n = int(response_valid.sum())
    response_ids = responses[:n].tolist()
    logprobs = batch.batch["rollout_log_probs"][i][:n].tolist() if "rollout_log_probs" in batch.batch else None
    extra = {k: v[i] for k, v in non_tensor.items() if isinstance(v, np.ndarray) and k not in ("raw_prompt",)}
    return Trajectory(
        prompt_ids=prompts[prompt_valid].tolist(),
        response_ids=response_ids,
        response_mask=batch.batch["response_mask"][i][:n].tolist(),
        response_logprobs=logprobs,
        response_text=tokenizer.decode(response_ids, skip_special_tokens=True),
        num_turns=int(non_tensor["__num_turns__"][i]),
        extra_fields=extra,
        metrics=dict(batch.meta_info["metrics"][i]),
    )


async def run_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    policy: Policy,
    agent_name: str | None = None,
    tool_config_path: str | os.PathLike | None = None,
    agent_loop_config_path: str | os.PathLike | None = None,
    max_turns: int = 4,
    tokenizer_dir: str | os.PathLike | None = None,
    compute_score: ScoreFn | None = None,
    reward_function: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    honour_stop: bool = True,
    **rollout_options: Any,
) -> RolloutResult:
    """Roll out ``rows`` through verl's ``AgentLoopWorker`` with ``policy`` as the model; call inside an event loop.

    ``agent_name`` overrides the rows' own column; ``compute_score`` (e.g. verl's ``default_compute_score``) scores
    each decoded response here, against ``reward_model.ground_truth``. ``reward_function`` (a file defining
    ``compute_score``, e.g. ``verl_search/reward.py``) instead scores inside verl's own streaming reward loop, as in
    training: the score is verl's ``rm_scores`` and the function's extra keys land in ``extra_fields``.
    ``rollout_options`` go to :func:`rollout_overrides`.
    """
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import agent_loop as agent_loop_module
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    model_path = Path(tokenizer_dir) if tokenizer_dir is not None else await asyncio.to_thread(ensure_tokenizer_dir)
    config = verl_trainer_config(
        rollout_overrides(
            model_path=model_path,
            tool_config_path=tool_config_path,
            agent_loop_config_path=agent_loop_config_path,
            max_turns=max_turns,
            **rollout_options,
        )
        + ([f"reward.custom_reward_function.path={reward_function}"] if reward_function is not None else [])
        + list(overrides)
    )
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, model_path)
    server = ScriptedServerManager(tokenizer, policy, honour_stop=honour_stop)
    saved_registry = dict(agent_loop_module._agent_loop_registry)
    try:  # AgentLoopWorker writes agent_loop_config_path entries into verl's global registry: undo that afterwards
        reward_handles = None
        if reward_function is not None:
            from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

            # built on the loop's thread: it keeps a reference to the current event loop
            reward_handles = [_LocalActor(RewardLoopWorker(config))]
        worker = await asyncio.to_thread(  # loads files: off the event loop
            AgentLoopWorker, config, llm_client=server, reward_loop_worker_handles=reward_handles
        )
        output = await worker.generate_sequences(rows_to_batch(rows, agent_name))
    finally:
        agent_loop_module._agent_loop_registry.clear()
        agent_loop_module._agent_loop_registry.update(saved_registry)
    trajectories = [_unpad(output, i, worker.tokenizer, output.non_tensor_batch) for i in range(len(rows))]
    if reward_function is not None:
        for i, trajectory in enumerate(trajectories):
            trajectory.score = float(output.batch["rm_scores"][i].sum())
    if compute_score is not None:
        for row, trajectory in zip(rows, trajectories, strict=True):
            trajectory.score = compute_score(
                row["data_source"],
                trajectory.response_text,
                row["reward_model"]["ground_truth"],
                row.get("extra_info"),
            )
    return RolloutResult(trajectories=trajectories, calls=server.calls, batch=output)


class _LocalActor:
    """Calls an in-process object the way verl calls a Ray actor handle: ``await handle.method.remote(...)``."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=getattr(self._target, name))
