"""Search trajectories in *other* toy worlds (other seeds), for pre-training the tiny policy on the task's format.

A real base model arrives able to copy a name from its prompt into a query and a year from a passage into an answer.
A 1.5M-parameter model from random weights cannot, and the few hundred SFT updates a CPU affords on the evaluated
world do not teach it (docs/results/training.md, findings). Trajectories from other worlds teach exactly that skill
and nothing about the evaluated world: their entities, cities and years are different draws, so every name must be
copied, not recalled. Each search result is the supporting passage itself (the retriever is not running for those
worlds), formatted and capped exactly as the search tool formats a result.
Invariant: a trajectory is kept only when its bridge name (two-hop) is in the first result and a gold answer is in the
last, the same rule as the evaluated world's SFT trajectories.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from cpu_bench.train.questions import all_questions
from cpu_bench.train.sft_data import Trajectory
from local_dense_retriever.toy.corpus import generate_toy_dataset
from local_dense_retriever.toy.world import ToyWorld
from verl_search.data.rows import shown_question
from verl_search.protocol import Document
from verl_search.tool.formatting import format_results


def world_dataset(world_seed: int, passages: int, cache_dir: Path):
    """Toy world ``world_seed``'s corpus (no questions), generated once under ``cache_dir`` and reused: the one folder
    naming the tokenizer, the language phase and the trajectories share, so each world is written once per run."""
    return generate_toy_dataset(cache_dir / f"world_{world_seed}_{passages}", passages, world_seed, num_questions=0)


def oracle_trajectories(world_seed: int, passages: int, max_result_chars: int, cache_dir: Path) -> Iterator[Trajectory]:
    """Every question of toy world ``world_seed`` as a trajectory whose searches return its supporting passages."""
    dataset = world_dataset(world_seed, passages, cache_dir)
    with open(dataset.corpus_path, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    world = ToyWorld(passages, world_seed)
    for question in all_questions(world):
        support = [int(i) for i in question["metadata"]["supporting_ids"]]
        shown = shown_question(question["question"])
        docs = [Document(**corpus[i]) for i in support]
        queries = [shown] + [world.name[i] for i in support[1:]]
        results = [format_results([q], [[d]], max_chars=max_result_chars) for q, d in zip(queries, docs, strict=True)]
        if len(queries) > 1 and queries[1].lower() not in results[0].lower():
            continue
        golds = tuple(question["golden_answers"])
        answer = next((g for g in golds if g.lower() in results[-1].lower()), None)
        if answer is None:
            continue
        yield Trajectory(shown, golds, len(support), answer, tuple(zip(queries, results, strict=True)))
