"""Input readers: Search-R1 parquet splits (local dir or Hugging Face hub) and FlashRAG-style jsonl -> raw rows.

Readers only fetch and decode; validation is schema.py's job. Failures raise SourceUnavailable/InputSchemaError.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from verl_search.data.errors import InputSchemaError, SourceUnavailable
from verl_search.jsonl import read_jsonl

logger = logging.getLogger(__name__)

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
