"""Failures of the preprocessing pipeline (drawn in :mod:`verl_search.errors`' tree); each message names the file,
column, row or key at fault, and the CLI turns them into one line and a non-zero exit.
"""

from __future__ import annotations

from verl_search.errors import VerlSearchError


class PreprocessError(VerlSearchError, ValueError):
    """Base of every preprocessing failure; no output file is written when one is raised."""

    kind = "preprocess"


class TemplateError(PreprocessError):
    kind = "template"


class InputSchemaError(PreprocessError):
    kind = "input_schema"


class SourceUnavailable(PreprocessError):
    kind = "source_unavailable"
