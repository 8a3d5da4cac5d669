"""Forwarding module: :mod:`verl_search.testing.background_server` (moved there) under its old path."""

import sys

from verl_search.testing import background_server as _moved

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
