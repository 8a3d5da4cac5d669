"""gc_freeze: the first tool built with it freezes the worker's start-up objects, once per process; without it the
collector is left alone. Each case runs in a fresh interpreter (freezing is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BUILD = """
import gc
from verl_search import SearchTool
before = gc.get_freeze_count()
SearchTool({{"retrieval_service_url": "http://127.0.0.1:9/retrieve", "gc_freeze": {flag}}})
first = gc.get_freeze_count()
SearchTool({{"retrieval_service_url": "http://127.0.0.1:9/retrieve", "gc_freeze": {flag}}})
print(before, first, gc.get_freeze_count())
"""


@pytest.mark.parametrize("flag", [True, False])
def test_the_first_tool_freezes_once_when_asked(flag):
    out = subprocess.run([sys.executable, "-c", BUILD.format(flag=flag)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, first, second = map(int, out.stdout.split())
    assert before == 0
    if flag:
        assert first > 10_000  # verl and its dependencies were imported: their objects are frozen
        assert second == first  # the second tool froze nothing more
    else:
        assert first == second == 0
