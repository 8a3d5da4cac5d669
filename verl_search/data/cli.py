"""Command line of the Search-R1 preprocessing (``data_preprocess/preprocess_searchR1_dataset.py`` calls ``main``).

Exit codes: 0 done, 1 a data/template/input problem (one line on stderr, no file written), 2 bad flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from verl_search.data.errors import PreprocessError
from verl_search.data.pipeline import (
    DEFAULT_HF_REPO_ID,
    DEFAULT_LOCAL_DIR,
    VAL_SUBSET_NAME,
    PreprocessConfig,
    run_preprocess,
)
from verl_search.data.templates import find_template_file, load_templates
from verl_search.errors import validation_text

#: rows per data source in the validation subset the CLI writes unless told otherwise (what training validates on)
DEFAULT_VAL_PER_SOURCE = 500

DESCRIPTION = f"""\
Turn Search-R1 QA data into verl RLHFDataset parquet files that route to the `search` tool.

Inputs (one of): --input_dir DIR with train.parquet/test.parquet in the Search-R1 schema, or already processed
into verl rows by verl <=0.5 or SkyRL (questions and answers are read from extra_info / prompt / reward_model or
reward_spec; validation.parquet is the test split when there is no test.parquet); --input_jsonl FILE in the
FlashRAG format (question, golden_answers[, id, data_source]); or, by default, the hub dataset --hf_repo_id
({DEFAULT_HF_REPO_ID}; cached under $HF_HOME, mirrors via $HF_ENDPOINT; offline without a cache is an error).
Outputs in --local_dir: train.parquet, test.parquet and {VAL_SUBSET_NAME} (at most --val_per_source test rows per
data source, default {DEFAULT_VAL_PER_SOURCE}, chosen reproducibly by --seed; the training script validates on it).
Nothing is written unless every row is valid."""


def _parser(default_config: Path | None, config_dirs: Sequence[Path]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = "".join(f", then in {d}" for d in config_dirs)
    parser.add_argument(
        "--config",
        type=Path,
        default=default_config,
        required=default_config is None,
        help=f"prompt templates YAML; a relative path is looked for from the working directory{where} "
        f"(default: {default_config})",
    )
    parser.add_argument("--template", help="template name in --config (default: the file's `default`)")
    parser.add_argument("--list_templates", action="store_true", help="list the templates in --config and exit")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--input_dir", type=Path, help="local dir with train.parquet / test.parquet (or validation.parquet)"
    )
    source.add_argument("--input_jsonl", type=Path, help="FlashRAG-style jsonl file")
    source.add_argument("--hf_repo_id", default=DEFAULT_HF_REPO_ID, help="hub dataset repo (default: %(default)s)")
    parser.add_argument("--hf_revision", help="hub revision: branch, tag or commit")
    parser.add_argument("--data_source", help="data source of jsonl rows without one (e.g. nq, toy)")
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=["train", "test"],
        help="splits to write (default: train test; for --input_jsonl: test, its rows go to each split listed)",
    )
    parser.add_argument("--local_dir", type=Path, default=Path(DEFAULT_LOCAL_DIR), help="output dir (%(default)s)")
    parser.add_argument(
        "--val_per_source",
        type=int,
        help=f"rows per data source in {VAL_SUBSET_NAME}, a seeded subsample of the test split "
        f"(default: {DEFAULT_VAL_PER_SOURCE} when the test split is written; 0 writes none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the validation subset (default: %(default)s)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser


def _val_per_source(args: argparse.Namespace) -> int:
    """The flag as given, else the default subset when the test split is written (every default split list has it)."""
    if args.val_per_source is not None:
        return args.val_per_source
    return DEFAULT_VAL_PER_SOURCE if args.splits is None or "test" in args.splits else 0


def _config(args: argparse.Namespace, config_dirs: Sequence[Path]) -> PreprocessConfig:
    same = ("template", "input_dir", "input_jsonl", "hf_repo_id", "hf_revision", "data_source", "local_dir", "seed")
    return PreprocessConfig(
        template_file=find_template_file(args.config, config_dirs),
        splits=tuple(args.splits) if args.splits else None,
        val_per_source=_val_per_source(args),
        **{name: getattr(args, name) for name in same},
    )


def main(
    argv: Sequence[str] | None = None, default_config: Path | None = None, config_dirs: Sequence[Path] = ()
) -> int:
    """Parse flags, run, print the written files with row counts per data source; returns the exit code.
    ``config_dirs``: folders a relative ``--config`` is looked for in after the working directory."""
    parser = _parser(default_config, config_dirs)
    args = parser.parse_args(argv)
    try:
        if args.list_templates:
            templates = load_templates(find_template_file(args.config, config_dirs))
            for name, template in templates.templates.items():
                mark = " (default)" if name == templates.default else ""
                print(f"{name}{mark}: agent_name={template.agent_name}; {template.description}")
            return 0
        try:
            config = _config(args, config_dirs)
        except ValidationError as e:
            parser.error(validation_text(e))
        outputs = run_preprocess(config, progress=not args.no_progress)
    except PreprocessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for output in outputs:
        print(f"{output.path}  ({output.split}, {output.total} rows)")
        for source, count in output.counts.items():
            print(f"    {source:<32} {count:>8}")
    if config.val_per_source == 0 and "test" in config.resolved_splits:
        stale = config.local_dir.expanduser() / VAL_SUBSET_NAME
        print(
            f"no {VAL_SUBSET_NAME} written (--val_per_source 0); the training script validates on "
            f"DATA_DIR/{VAL_SUBSET_NAME} by default"
            + (f"; the {stale} already there is from an earlier run, left unchanged" if stale.is_file() else "")
        )
    return 0
