"""Forwarding module: :mod:`verl_search.testing.scripted_demo` (moved there) under its old path;
``python -m verl_search.demo`` still runs it."""

import sys

from verl_search.testing import scripted_demo as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
