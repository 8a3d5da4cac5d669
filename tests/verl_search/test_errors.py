"""One error tree: every exception class defined anywhere in ``verl_search`` and the CPU test bench (``cpu_bench``) is
under ``VerlSearchError``, and the tree drawn at the top of ``verl_search/errors.py`` names each of them; only the
tool's failures are ``SearchError``s (the tool boundary turns those into model-facing text)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import cpu_bench
import verl_search
from verl_search import errors
from verl_search.errors import SearchError, VerlSearchError

#: where ``SearchError``s may be declared: the tool's tree, plus launch's config errors (a ``ConfigError`` subclass)
SEARCH_ERROR_HOMES = ("verl_search.errors", "verl_search.tool.", "verl_search.launch.trainer_config")


def _defined_exceptions() -> dict[str, type[BaseException]]:
    """``{qualified name: class}`` of every exception class defined at the top of a ``verl_search`` or ``cpu_bench``
    module."""
    found = {}
    packages = [(verl_search.__path__, "verl_search."), (cpu_bench.__path__, "cpu_bench.")]
    for info in [info for path, prefix in packages for info in pkgutil.walk_packages(path, prefix=prefix)]:
        if info.name.rpartition(".")[2] == "__main__":
            continue  # running it is the CLI; its names come from the modules it imports
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{name}"] = obj
    return found


DEFINED = _defined_exceptions()


def test_the_walk_finds_the_branches_declared_outside_errors_py():
    assert {
        "cpu_bench.train.processes.StageError",
        "cpu_bench.train.sft_data.TrajectoryError",
        "cpu_bench.train.run_settings.SettingsMismatch",
        "verl_search.report.DumpError",
        "verl_search.data.errors.PreprocessError",
    } <= set(DEFINED)


@pytest.mark.parametrize("name", sorted(DEFINED))
def test_every_error_is_under_the_package_root(name):
    assert issubclass(DEFINED[name], VerlSearchError), f"{name} is outside verl_search.errors' tree"


@pytest.mark.parametrize("name", sorted(DEFINED))
def test_the_tree_at_the_top_of_errors_py_names_every_error(name):
    assert DEFINED[name].__name__ in (errors.__doc__ or ""), f"{name} is missing from verl_search.errors' docstring"


@pytest.mark.parametrize("name", sorted(DEFINED))
def test_only_the_tools_failures_are_search_errors(name):
    """``run_search`` turns any SearchError into text for the model; a tooling error must never be mistaken for one."""
    if issubclass(DEFINED[name], SearchError):
        assert name.startswith(SEARCH_ERROR_HOMES), f"{name} is a tooling error under SearchError"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("cpu_bench.train.processes.StageError", RuntimeError),
        ("cpu_bench.train.sft_data.TrajectoryError", ValueError),
        ("cpu_bench.train.run_settings.SettingsMismatch", ValueError),
        ("verl_search.report.DumpError", ValueError),
        ("verl_search.data.errors.PreprocessError", ValueError),
        ("verl_search.errors.CpuRolloutConfigError", ValueError),
    ],
)
def test_callers_that_catch_the_builtin_still_do(name, builtin):
    assert issubclass(DEFINED[name], builtin)


def test_a_validation_error_reads_as_one_line_naming_each_key_below_its_object():
    from pydantic import BaseModel, Field, ValidationError, model_validator

    class Limits(BaseModel):
        low: int = Field(0, ge=0)
        high: int = 1

        @model_validator(mode="after")
        def _ordered(self) -> Limits:
            if self.high <= self.low:
                raise ValueError("high must be above low")
            return self

    with pytest.raises(ValidationError) as bad_fields:
        Limits(low=-1, high="x")
    assert errors.validation_text(bad_fields.value, "run.limits") == (
        "run.limits.low: Input should be greater than or equal to 0; "
        "run.limits.high: Input should be a valid integer, unable to parse string as an integer"
    )
    with pytest.raises(ValidationError) as bad_whole:
        Limits(low=2, high=1)
    assert errors.validation_text(bad_whole.value, "run.limits") == "run.limits: high must be above low"
    assert errors.validation_text(bad_whole.value) == "high must be above low"
