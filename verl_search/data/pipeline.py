"""The preprocessing run: read inputs (Search-R1 parquet splits, local or from the Hugging Face hub, or FlashRAG-style
jsonl), validate every row, build verl rows, write all outputs at once.

Invariants: outputs are written only after every input row of every split validated, and either every file appears or
none does; the same inputs and config give byte-identical files; the validation subset depends only on (seed, source,
row id), so the subset for N rows is inside the one for M > N.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from verl_search.atomic import atomic_path
from verl_search.data.errors import InputSchemaError, SourceUnavailable
from verl_search.data.rows import OUTPUT_SCHEMA, build_row
from verl_search.data.schema import (
    REQUIRED_JSONL_KEYS,
    REQUIRED_PARQUET_COLUMNS,
    QARecord,
    check_columns,
    is_processed,
    parse_record,
    recover_row,
)
from verl_search.data.templates import load_templates
from verl_search.jsonl import read_jsonl

logger = logging.getLogger(__name__)

T = TypeVar("T")
Split = Literal["train", "test"]
VAL_SUBSET_NAME = "val_subset.parquet"
DEFAULT_LOCAL_DIR = "~/data/searchR1_processed_direct"
DEFAULT_HF_REPO_ID = "PeterJinGo/nq_hotpotqa_train"


def read_parquet_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Column names and rows of a parquet file (list columns come back as numpy arrays, as pandas gives them)."""
    import pandas as pd
    import pyarrow as pa

    if not path.is_file():
        raise SourceUnavailable(f"input file not found: {path}")
    try:
        frame = pd.read_parquet(path)
    except (OSError, pa.ArrowException) as e:
        raise SourceUnavailable(f"cannot read parquet file {path}: {e}") from e
    return list(frame.columns), frame.to_dict(orient="records")


def read_jsonl_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line; a bad line raises InputSchemaError naming it."""
    if not path.is_file():
        raise SourceUnavailable(f"input file not found: {path}")
    rows = []
    for number, obj in read_jsonl(path, InputSchemaError):
        if not isinstance(obj, dict):
            raise InputSchemaError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        rows.append((number, obj))
    if not rows:
        raise InputSchemaError(f"{path}: no rows")
    return rows


def download_split(
    repo_id: str, split: str, *, revision: str | None = None, cache_dir: Path | None = None, endpoint: str | None = None
) -> Path:
    """Local path of ``{split}.parquet`` from the hub dataset repo (cached by huggingface_hub; resumes downloads)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    filename = f"{split}.parquet"
    try:
        local = hf_hub_download(
            repo_id=repo_id,
            filename=filename,
            repo_type="dataset",
            revision=revision,
            cache_dir=cache_dir,
            endpoint=endpoint,
        )
    except LocalEntryNotFoundError as e:  # subclasses EntryNotFoundError: must come first
        raise SourceUnavailable(
            f"cannot download {filename} from hub dataset {repo_id} (offline, no cached copy); pass --input_dir"
        ) from e
    except EntryNotFoundError as e:
        raise SourceUnavailable(f"hub dataset {repo_id} has no file {filename}") from e
    except (HfHubHTTPError, OSError) as e:
        raise SourceUnavailable(f"cannot download {filename} from hub dataset {repo_id}: {e}") from e
    logger.info("using %s", local)
    return Path(local)


class PreprocessConfig(BaseModel):
    """Everything one preprocessing run depends on (the CLI flags, one to one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template_file: Path = Field(description="prompt.yaml with the named templates.")
    template: str | None = Field(default=None, description="Template name; None takes the file's default.")
    input_dir: Path | None = Field(
        default=None, description="Local dir with train.parquet and test.parquet (or validation.parquet)."
    )
    input_jsonl: Path | None = Field(default=None, description="FlashRAG-style jsonl (question, golden_answers).")
    hf_repo_id: str = Field(
        default=DEFAULT_HF_REPO_ID, description="Hub dataset repo read when neither input_dir nor input_jsonl is set."
    )
    hf_revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    data_source: str | None = Field(
        default=None, min_length=1, description="Data source of jsonl rows that carry none (e.g. nq, toy)."
    )
    splits: tuple[Split, ...] | None = Field(
        default=None, min_length=1, description="Splits to write; default train+test, test for jsonl input."
    )
    local_dir: Path = Field(default=Path(DEFAULT_LOCAL_DIR), description="Output directory.")
    val_per_source: int = Field(
        default=0, ge=0, description="Test rows per data source in val_subset.parquet; 0 writes none."
    )
    seed: int = Field(default=0, description="Seed of the validation subset choice.")

    @model_validator(mode="after")
    def _consistent(self) -> PreprocessConfig:
        if self.input_dir is not None and self.input_jsonl is not None:
            raise ValueError("give either input_dir or input_jsonl, not both")
        if self.hf_revision is not None and (self.input_dir is not None or self.input_jsonl is not None):
            raise ValueError("hf_revision applies only to hub input (no input_dir / input_jsonl)")
        if self.data_source is not None and self.input_jsonl is None:
            raise ValueError("data_source applies only to input_jsonl")
        if self.splits is not None and len(set(self.splits)) != len(self.splits):
            raise ValueError(f"splits listed twice: {list(self.splits)}")
        if self.val_per_source and "test" not in self.resolved_splits:
            raise ValueError("val_per_source subsamples the test split, but test is not among the splits")
        return self

    @property
    def resolved_splits(self) -> tuple[Split, ...]:
        if self.splits is not None:
            return self.splits
        return ("test",) if self.input_jsonl is not None else ("train", "test")


class OutputFile(BaseModel):
    """One written file and how many rows of each data source it holds."""

    model_config = ConfigDict(frozen=True)

    path: Path
    split: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _records_from_parquet(path: Path, progress: bool) -> list[QARecord]:
    """Search-R1's raw rows, or rows already in verl's format (their question and answers recovered)."""
    columns, raw_rows = read_parquet_rows(path)
    processed = is_processed(columns)
    if processed:
        logger.info("%s is already in verl's row format: questions and answers are read from its columns", path)
    else:
        check_columns(columns, REQUIRED_PARQUET_COLUMNS, str(path))
    if not raw_rows:
        raise InputSchemaError(f"{path}: no rows")
    records = []
    for i, raw in enumerate(_progress(raw_rows, f"validating {path.name}", progress)):
        where = f"{path} row {i}"
        records.append(
            parse_record(recover_row(raw, where) if processed else raw, where, default_id=f"{path.stem}_{i}")
        )
    return records


def _split_file(input_dir: Path, split: Split) -> Path:
    """``{split}.parquet``; for the test split, ``validation.parquet`` when there is no ``test.parquet`` (SkyRL)."""
    path = input_dir / f"{split}.parquet"
    if split == "test" and not path.is_file():
        validation = input_dir / "validation.parquet"
        if validation.is_file():
            logger.info("no %s: using %s as the test split", path, validation)
            return validation
        raise SourceUnavailable(f"input file not found: {path} (nor {validation.name})")
    return path


def _records_from_jsonl(path: Path, default_source: str | None, progress: bool) -> list[QARecord]:
    records = []
    for i, (line, raw) in enumerate(_progress(read_jsonl_rows(path), f"validating {path.name}", progress)):
        where = f"{path}:{line}"
        check_columns(raw.keys(), REQUIRED_JSONL_KEYS, where)
        if "data_source" not in raw and default_source is None:
            raise InputSchemaError(f"{where}: row has no data_source; pass --data_source")
        records.append(parse_record(raw, where, default_id=f"{path.stem}_{i}", default_source=default_source))
    return records


def _progress(items: list, desc: str, enabled: bool) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="row")


def _input_records(config: PreprocessConfig, split: Split, progress: bool) -> list[QARecord]:
    if config.input_jsonl is not None:
        return _records_from_jsonl(config.input_jsonl, config.data_source, progress)
    if config.input_dir is not None:
        path = _split_file(config.input_dir, split)
    else:
        path = download_split(config.hf_repo_id, split, revision=config.hf_revision)
    return _records_from_parquet(path, progress)


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(row["data_source"] for row in rows).items()))


def stratified_subsample(
    items: Sequence[T], per_source: int, seed: int, source_of: Callable[[T], str], key_of: Callable[[T], str]
) -> list[T]:
    """At most ``per_source`` items of each source, in order: those first by a stable hash of (seed, source, key)."""
    if per_source < 1:
        raise ValueError(f"per_source must be >= 1, got {per_source}")
    by_source: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        by_source.setdefault(source_of(item), []).append(position)
    keep: set[int] = set()
    for source, positions in by_source.items():
        rank = {p: hashlib.sha256(f"{seed}\x00{source}\x00{key_of(items[p])}".encode()).digest() for p in positions}
        keep.update(sorted(positions, key=lambda p: (rank[p], p))[:per_source])
    return [item for position, item in enumerate(items) if position in keep]


def write_parquet_files(files: Mapping[Path, Sequence[Mapping[str, Any]]], schema: pa.Schema) -> list[Path]:
    """Write each ``path -> rows`` with ``schema``; either every file appears or none does."""
    with contextlib.ExitStack() as stack:
        for path, rows in files.items():
            tmp = stack.enter_context(atomic_path(path))
            table = pa.Table.from_pylist(list(rows), schema=schema)
            pq.write_table(table, str(tmp), compression="zstd", row_group_size=16384, write_statistics=True)
    logger.info("wrote %s", ", ".join(map(str, files)))
    return list(files)


def run_preprocess(config: PreprocessConfig, progress: bool = False) -> list[OutputFile]:
    """Run the whole preprocessing; returns the files written (train, test, then the validation subset)."""
    _, template = load_templates(config.template_file).get(config.template)
    local_dir = config.local_dir.expanduser()
    outputs: dict[Path, tuple[str, list[dict[str, Any]]]] = {}
    for split in config.resolved_splits:
        records = _input_records(config, split, progress)
        rows = [build_row(record, template, split, index) for index, record in enumerate(records)]
        outputs[local_dir / f"{split}.parquet"] = (split, rows)
        if split == "test" and config.val_per_source:
            subset = stratified_subsample(
                rows,
                config.val_per_source,
                config.seed,
                source_of=lambda row: row["data_source"],
                key_of=lambda row: row["extra_info"]["id"],
            )
            outputs[local_dir / VAL_SUBSET_NAME] = ("val_subset", subset)
    write_parquet_files({path: rows for path, (_, rows) in outputs.items()}, OUTPUT_SCHEMA)
    return [OutputFile(path=path, split=split, counts=_counts(rows)) for path, (split, rows) in outputs.items()]
