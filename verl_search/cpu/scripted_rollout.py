"""Forwarding module: :mod:`verl_search.testing.scripted_rollout` (moved there) under its old path."""

import sys

from verl_search.testing import scripted_rollout as _moved

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
