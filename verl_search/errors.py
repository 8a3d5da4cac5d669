"""Every failure verl-search can raise, in one tree under :class:`VerlSearchError`.

    VerlSearchError                      the package root: ``except VerlSearchError`` catches every failure of ours
    ├── SearchError                      a search call failed (the tool's branch, turned into model-facing text)
    │   ├── ConfigError (ValueError)     the tool YAML / config dict is invalid (at start-up, never mid-rollout)
    │   │   └── launch.trainer_config.LaunchConfigError   a training/eval override verl would reject
    │   ├── InvalidArguments (ValueError)  the model's tool arguments are unusable; no request was sent
    │   └── RetrievalError               a request to the retrieval service failed
    │       ├── DeadlineExceeded         the call's overall deadline passed (retries included)
    │       ├── ServiceUnavailable       connection refused/dropped, 429/503 after retries, no healthy endpoint
    │       ├── RequestRejected          the service answered 4xx (our request was wrong; never retried)
    │       ├── ServerError              the service answered 5xx other than 503 (never retried)
    │       ├── BudgetSpent              the service's web search budget for this run is spent (never retried)
    │       ├── NotCached                the service replays a web cache that lacks the query (never retried)
    │       ├── PageNotFound             /access answered null: the service holds no page for the url (never retried)
    │       └── BadResponse              the reply was not JSON or not the /retrieve shape (never retried)
    ├── data.errors.PreprocessError (ValueError)   preprocessing failed; the CLI prints it and exits 1
    │   ├── TemplateError                prompt.yaml is unreadable or a template is invalid / unknown
    │   ├── InputSchemaError             an input file lacks a column, or a row has an empty/ill-typed field
    │   └── SourceUnavailable            an input file or hub download cannot be obtained
    ├── launch.checks.PreflightError     a launch precondition that fails
    │   └── PreflightWarning             a problem that does not stop the launch
    ├── launch.gpu_locks.LockFileError   a GPU lock file is missing or not pinned
    ├── launch.run_outputs.CheckpointError (ValueError)   RESUME_FROM names no verl checkpoint
    ├── KnobError (ValueError)           a run script's knob (a TRAINER knob included) has a value it cannot take
    ├── report.DumpError (ValueError)    the validation dumps or data cannot make the report
    ├── CpuBackendError                  the CPU training backend (``verl_search.cpu``) cannot run as configured
    │   ├── UnsupportedVerlError         the installed verl is not the version whose gaps we bridge
    │   ├── UnsupportedVllmError         the installed vLLM CPU build is not one whose gaps with verl we bridge
    │   ├── UnsupportedSglangError       the installed SGLang is not one whose CPU gaps with verl we bridge
    │   ├── CpuRolloutConfigError (ValueError)         engine_kwargs.<backend> of the rollout config is invalid
    │   └── WeightSyncTimeout (TimeoutError)           the zmq checkpoint engine waited past its deadline
    ├── ResourceMissing (FileNotFoundError)           a shipped file (tool YAML, prompt.yaml) is not installed
    ├── cpu_bench.gpu_smoke.SmokeError   a stage of make gpu-smoke failed (the message names its log)
    ├── cpu_bench.train.processes.StageError (RuntimeError)       a ``make train`` stage failed or left no output
    ├── cpu_bench.train.run_settings.SettingsMismatch (ValueError) the run folder was built with other settings
    ├── cpu_bench.train.seeds.SeedRunError (ValueError)           a folder it was given is not a finished run
    ├── cpu_bench.train.shipped_base.ShippedBaseError             the shipped base model differs from the code's
    ├── cpu_bench.train.toy_web.RecordingMissing (FileNotFoundError)  --search web-replay was given no recorded cache
    └── cpu_bench.train.sft_data.TrajectoryError (ValueError)     an SFT trajectory cannot be built faithfully

Branches outside this module are declared beside the code that raises them (paths relative to ``verl_search``, or
in ``cpu_bench``); a builtin in parentheses is a second base, kept so callers that catch it still do. ``run_search``
and ``run_access`` are the boundaries that turn ``SearchError`` into model-facing text (both through
``tool.failures``); a tooling error inside a search is reported as internal, and each command turns its own into one
line and a non-zero exit. ``kind`` labels texts and counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class VerlSearchError(Exception):
    """Base of every verl-search error."""

    kind = "error"


class KnobError(VerlSearchError, ValueError):
    """A run script's knob (an environment variable) has a value it cannot take; the message names the knob."""

    kind = "knob"


class SearchError(VerlSearchError):
    """A search call failed: base of the tool's errors, which the tool boundary turns into model-facing text."""


class ConfigError(SearchError, ValueError):
    """The tool configuration is invalid; the message names the offending key."""

    kind = "config"


class InvalidArguments(SearchError, ValueError):
    """The model's arguments cannot be turned into queries. The message is shown to the model."""

    kind = "invalid_arguments"


class RetrievalError(SearchError):
    """A request to the retrieval service failed."""

    kind = "retrieval"
    #: whether a retry may succeed (timeouts, connection errors, 429, 503)
    retryable = False


class DeadlineExceeded(RetrievalError):
    kind = "timeout"
    retryable = True


class ServiceUnavailable(RetrievalError):
    kind = "unavailable"
    retryable = True

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        #: HTTP status (429/503) when the service answered; None for connection failures
        self.status = status
        self.retry_after = retry_after


class RequestRejected(RetrievalError):
    kind = "rejected"


class ServerError(RetrievalError):
    kind = "server_error"


class BadResponse(RetrievalError):
    kind = "bad_response"


class BudgetSpent(RetrievalError):
    """The service answered ``budget_exhausted``: its live web calls for this run are used up. A retry cannot help
    and the endpoint is not at fault."""

    kind = "budget"


class NotCached(RetrievalError):
    """The service answered ``not_cached``: it replays a web cache offline and this query was never recorded. A retry
    cannot help and the endpoint is not at fault."""

    kind = "unavailable"


class PageNotFound(RetrievalError):
    """``POST /access`` answered null for the url: no page is stored under it. A retry cannot help and the endpoint is
    not at fault."""

    kind = "not_found"


class CpuBackendError(VerlSearchError):
    """Base of the CPU backend's errors."""

    kind = "cpu_backend"


class UnsupportedVerlError(CpuBackendError):
    """The CPU backend relies on verl internals that it checks by version; the message names both versions."""

    kind = "unsupported_verl"


class UnsupportedVllmError(CpuBackendError):
    """The installed vLLM CPU build is not one whose gaps with verl's vLLM rollout we checked; names the version."""

    kind = "unsupported_vllm"


class UnsupportedSglangError(CpuBackendError):
    """The installed SGLang is not one whose CPU gaps with verl's SGLang rollout we checked; names the version."""

    kind = "unsupported_sglang"


class CpuRolloutConfigError(CpuBackendError, ValueError):
    """The CPU rollout options are invalid; the message names the key."""

    kind = "cpu_rollout_config"


class WeightSyncTimeout(CpuBackendError, TimeoutError):
    """A weight sync of the ``zmq`` checkpoint engine waited past its deadline; the message says for what."""

    kind = "weight_sync_timeout"


class ResourceMissing(VerlSearchError, FileNotFoundError):
    """A file the package ships (``verl_search.resources``) is in neither a checkout nor the installed package."""

    kind = "resource_missing"


def validation_text(error: ValidationError, within: str = "") -> str:
    """A pydantic validation error in one line: each problem as ``key: message``, the key dotted below ``within`` (the
    validated object's name, which also stands for the object itself when a check of the whole object fails)."""
    problems = []
    for err in error.errors():
        key = ".".join(str(part) for part in (within, *err["loc"]) if part != "")
        message = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{key}: {message}" if key else message)
    return "; ".join(problems)
