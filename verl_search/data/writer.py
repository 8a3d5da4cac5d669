"""Deterministic, all-or-nothing parquet writing: every file goes to a temporary name first, then all are renamed.

Invariant: a failure before the renames leaves no output file (and no temporary file) behind; the bytes depend only
on the rows, the schema and the pyarrow version (no timestamps, no pandas metadata).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)


def _write_one(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, path: Path) -> Path:
    table = pa.Table.from_pylist(list(rows), schema=schema)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp_name, compression="zstd", row_group_size=16384, write_statistics=True)
        os.chmod(tmp_name, 0o644)  # mkstemp makes 0600; outputs are ordinary shared data files
    except BaseException:
        os.unlink(tmp_name)
        raise
    return Path(tmp_name)


def write_parquet_files(files: Mapping[Path, Sequence[Mapping[str, Any]]], schema: pa.Schema) -> list[Path]:
    """Write each ``path -> rows`` with ``schema``; either every file appears or none does."""
    written: list[tuple[Path, Path]] = []
    try:
        for path, rows in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            written.append((_write_one(rows, schema, path), path))
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in written:
        os.replace(tmp, path)
        logger.info("wrote %s", path)
    return [path for _, path in written]
