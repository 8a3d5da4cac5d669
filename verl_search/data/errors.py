"""Failures of the preprocessing pipeline; each message names the file, column, row or key at fault.

    PreprocessError(VerlSearchError, ValueError)
    ├── TemplateError      prompt.yaml is unreadable or a template is invalid / unknown
    ├── InputSchemaError   an input file lacks a column, or a row has an empty/ill-typed field
    └── SourceUnavailable  an input file or hub download cannot be obtained (missing, offline, not found)

The CLI is the one boundary that turns these into a one-line message and a non-zero exit code.
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
