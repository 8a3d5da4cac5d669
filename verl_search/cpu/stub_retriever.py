"""Forwarding module: :mod:`verl_search.testing.stub_retriever` (moved there) under its old path;
``python -m verl_search.cpu.stub_retriever`` still runs it."""

import sys

from verl_search.testing import stub_retriever as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
