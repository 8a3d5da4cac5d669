"""Suite-wide collection order: the tests that run verl's trainer end to end (minutes each) go first.

`make test` runs the suite on two pytest-xdist workers, one test file at a time per worker, in collection order
(`--no-loadscope-reorder`: xdist would otherwise start the files with the most tests first, and these files hold one
each). Started last, a trainer test leaves one worker running alone for its last minutes; started first, the two
workers finish together. Order does not change what any test checks.
"""

from __future__ import annotations

import pytest

#: the fixture that launches verl's trainer (tests/verl_search/cpu/conftest.py)
TRAINER_FIXTURE = "launch_cpu_run"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: TRAINER_FIXTURE not in getattr(item, "fixturenames", ()))  # stable: else as collected
