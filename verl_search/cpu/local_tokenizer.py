"""Forwarding module: :mod:`verl_search.train.local_tokenizer` (moved there) under its old path."""

import sys

from verl_search.train import local_tokenizer as _moved

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
