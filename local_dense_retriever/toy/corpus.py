"""Toy corpus generator: deterministic wiki-18-shaped passages plus single- and two-hop QA pairs, 50 to 1M+ rows.

Invariant: ``corpus.jsonl`` and ``qa.jsonl`` are byte-identical for the same (num_passages, seed, num_questions);
every file is written under a temporary name and renamed, and the manifest ``toy.json`` is written last, so a
folder with a matching manifest is complete and is reused as is.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from local_dense_retriever.toy.questions import generate_questions, max_questions
from local_dense_retriever.toy.world import MIN_PASSAGES, ToyWorld
from verl_search.atomic import atomic_path

logger = logging.getLogger(__name__)

CORPUS_FILE, QA_FILE, MANIFEST_FILE = "corpus.jsonl", "qa.jsonl", "toy.json"
#: bump when the generated text changes, so stale folders are rebuilt
FORMAT_VERSION = 1
_CHUNK = 4096


@dataclass(frozen=True)
class ToyDataset:
    """A generated toy dataset on disk."""

    out_dir: Path
    corpus_path: Path
    qa_path: Path
    num_passages: int
    num_questions: int
    seed: int


def default_num_questions(num_passages: int) -> int:
    """``min(1000, num_passages // 10)``: half single-hop, half two-hop."""
    return min(1000, num_passages // 10)


def _manifest(num_passages: int, seed: int, num_questions: int) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "num_passages": num_passages,
        "seed": seed,
        "num_questions": num_questions,
    }


def _is_complete(out_dir: Path, wanted: dict) -> bool:
    try:
        found = json.loads((out_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        sizes = {name: (out_dir / name).stat().st_size for name in (CORPUS_FILE, QA_FILE)}
    except (OSError, ValueError):
        return False
    return (
        isinstance(found, dict)
        and {k: found.get(k) for k in wanted} == wanted
        and found.get("bytes") == {name: sizes[name] for name in (CORPUS_FILE, QA_FILE)}
    )


def _write_corpus(world: ToyWorld, path: Path, progress: bool) -> int:
    n = world.num_passages
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        with tqdm(total=n, desc="toy corpus", unit="passage", disable=not progress, mininterval=1.0) as bar:
            dumps, passage = json.dumps, world.passage
            for start in range(0, n, _CHUNK):
                stop = min(n, start + _CHUNK)
                f.write(
                    "".join(
                        dumps({"id": str(r), "contents": passage(r)}, ensure_ascii=False) + "\n"
                        for r in range(start, stop)
                    )
                )
                bar.update(stop - start)
        f.flush()
    return path.stat().st_size


def _write_qa(world: ToyWorld, path: Path, num_questions: int) -> int:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for row in generate_questions(world, num_questions):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path.stat().st_size


def generate_toy_dataset(
    out_dir: Path,
    num_passages: int = 10_000,
    seed: int = 0,
    num_questions: int | None = None,
    *,
    progress: bool | None = None,
) -> ToyDataset:
    """Write (or reuse) ``out_dir/corpus.jsonl`` and ``out_dir/qa.jsonl``; see the module docstring.

    Corpus rows are ``{"id": "<row>", "contents": "\\"Title\\"\\n<about 100 words>"}``; QA rows are FlashRAG-style
    ``{"id", "question", "golden_answers", "data_source": "toy", "metadata": {"hops", "supporting_ids"}}``.
    ``progress=None`` shows a progress bar for corpora of 100k passages or more.
    Raises ``ValueError`` for sizes the generator cannot produce.
    """
    out_dir = Path(out_dir)
    if isinstance(num_passages, bool) or not isinstance(num_passages, int) or num_passages < MIN_PASSAGES:
        raise ValueError(f"num_passages must be an integer of at least {MIN_PASSAGES}, got {num_passages!r}")
    if num_questions is None:
        num_questions = default_num_questions(num_passages)
    dataset = ToyDataset(out_dir, out_dir / CORPUS_FILE, out_dir / QA_FILE, num_passages, num_questions, seed)
    wanted = _manifest(num_passages, seed, num_questions)
    if _is_complete(out_dir, wanted):
        logger.info("reusing complete toy dataset in %s", out_dir)
        return dataset
    world = ToyWorld(num_passages, seed)  # validates the seed
    if not 0 <= num_questions <= max_questions(world):
        raise ValueError(
            f"num_questions must be between 0 and {max_questions(world)} for {num_passages} passages, "
            f"got {num_questions}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)  # the folder is incomplete until the manifest is back
    show = num_passages >= 100_000 if progress is None else progress
    sizes = {CORPUS_FILE: _write_corpus(world, dataset.corpus_path, show)}
    sizes[QA_FILE] = _write_qa(world, dataset.qa_path, num_questions)
    with atomic_path(out_dir / MANIFEST_FILE) as tmp:
        tmp.write_text(json.dumps({**wanted, "bytes": sizes}, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote toy dataset (%d passages, %d questions) to %s", num_passages, num_questions, out_dir)
    return dataset


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m local_dense_retriever.toy.corpus --out_dir DIR [--num_passages N] [--seed S]``."""
    parser = argparse.ArgumentParser(description="Generate the deterministic toy corpus and its QA pairs.")
    parser.add_argument("--out_dir", type=Path, required=True, help="folder for corpus.jsonl, qa.jsonl, toy.json")
    parser.add_argument("--num_passages", type=int, default=10_000, help="corpus size (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--num_questions", type=int, default=None, help="default: min(1000, num_passages // 10)")
    args = parser.parse_args(argv)
    try:
        ds = generate_toy_dataset(
            args.out_dir, args.num_passages, args.seed, args.num_questions, progress=args.num_passages >= 10_000
        )
    except (ValueError, OSError) as e:
        print(f"toy_corpus: error: {e}", file=sys.stderr)
        return 1
    print(f"corpus: {ds.corpus_path} ({ds.num_passages} passages)")
    print(f"qa:     {ds.qa_path} ({ds.num_questions} questions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
