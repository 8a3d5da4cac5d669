"""A tiny model that really writes both search protocols, for testing a real rollout engine (vLLM, SGLang) end to end.

A random tiny model never emits a tool call, and a real engine cannot be told what to write (the ``hf_cpu`` backend's
opening policies do not exist inside vLLM). So the engine tests start from a model warm-started here: a few hundred
updates on one question family in both protocols, a search for ``query`` in the hermes form (``<tool_call>`` JSON,
read by the engine's hermes parser for ``tool_agent``) and in Search-R1's form (``<search> ... </search>``, ended by
the ``</search>`` stop string of ``search_r1_agent``), then, after the search result, an answer drawn from
``answers`` (two or more answers keep GRPO's rewards apart within a group, so the update is not zero).

Rows are rendered by :func:`cpu_bench.train.sft_data.sft_row` and laid out by verl's SFT dataset exactly as the
``make train`` SFT stage trains on them, and trained by :func:`cpu_bench.train.pretrain.train_on_trajectories`.
The result is cached under the user's cache folder, keyed by everything it is built from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cpu_bench.train.sft_data import PROTOCOLS, RowSettings, Trajectory, sft_row
from verl_search.data.rows import shown_question

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartSpec:
    """What the warm-started model learns to write, and how long it trains."""

    questions: tuple[str, ...]
    query: str
    result: str  # the search result the trajectories show (the real retriever's answer to ``query``, ideally)
    answers: tuple[str, ...] = ("Paris", "Lyon")
    steps: int = 80
    lr: float = 2e-3
    seed: int = 0


def trajectories(spec: WarmStartSpec) -> list[Trajectory]:
    """One single-search trajectory per (question, answer): search ``spec.query``, read the result, answer. The
    question is shown as the preprocessed rows show it (``shown_question``): a tiny model keys on every token."""
    if not spec.questions or not spec.answers:
        raise ValueError("a warm start needs at least one question and one answer")
    return [
        Trajectory(shown_question(question), (answer,), 1, answer, ((spec.query, spec.result),))
        for question in spec.questions
        for answer in spec.answers
    ]


def token_rows(spec: WarmStartSpec, settings: RowSettings, tokenizer) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, loss_mask)`` of every trajectory in both protocols, as verl's SFT dataset lays them out."""
    import pandas as pd
    from omegaconf import OmegaConf

    from cpu_bench.train.sft_dataset import SearchSFTDataset

    rows = [sft_row(t, protocol, settings, "warm_start") for t in trajectories(spec) for protocol in PROTOCOLS]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.parquet"
        pd.DataFrame(rows).to_parquet(path, index=False)
        config = OmegaConf.create({"pad_mode": "no_padding", "truncation": "error", "max_length": 4096})
        dataset = SearchSFTDataset(str(path), tokenizer, config)
        items = [dataset[i] for i in range(len(dataset))]
    return [(item["input_ids"].tolist(), item["loss_mask"].tolist()) for item in items]


def cache_key(model_dir: Path, spec: WarmStartSpec, settings: RowSettings) -> str:
    """A digest of the model's files and everything the rows are built from."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    rendering = [settings.hermes_template.render("q"), settings.native_template.render("q"), settings.tool_schemas]
    digest.update(json.dumps([asdict(spec), rendering, settings.max_turns], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def warm_start(model_dir: Path, spec: WarmStartSpec, settings: RowSettings, cache_dir: Path | None = None) -> Path:
    """The model in ``model_dir`` trained to write both protocols (see the module docstring); built once per key."""
    from transformers import AutoTokenizer

    from cpu_bench.train.config import PretrainSettings
    from cpu_bench.train.pretrain import BatchShapes, train_on_trajectories

    if cache_dir is None:
        from local_dense_retriever.config import default_cache_dir

        cache_dir = default_cache_dir() / "protocol_warm_start"
    out = Path(cache_dir) / cache_key(model_dir, spec, settings)
    if (out / "config.json").is_file():
        logger.info("reusing the protocol warm start %s", out)
        return out
    rows = token_rows(spec, settings, AutoTokenizer.from_pretrained(model_dir))
    schedule = PretrainSettings(task_steps=spec.steps, lr=spec.lr)
    stats = train_on_trajectories(model_dir, out, rows, schedule, BatchShapes(warmup_steps=10, seed=spec.seed))
    logger.info("protocol warm start: %s", stats)
    return out


def probe_texts(model_dir: Path, prompts: Sequence[list[dict]], tools: list[dict] | None, max_new_tokens: int = 64):
    """Greedy continuations of ``prompts`` by the model in ``model_dir`` (transformers), for checking a warm start."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    texts = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            prompt, tools=tools, add_generation_prompt=True, return_tensors="pt", return_dict=False
        )
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False))
    return texts
