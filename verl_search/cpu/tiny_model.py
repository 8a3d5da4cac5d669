"""Forwarding module: :mod:`verl_search.train.tiny_model` (moved there) under its old path;
``python -m verl_search.cpu.tiny_model`` still runs it."""

import sys

from verl_search.train import tiny_model as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())

sys.modules[__name__] = _moved  # the old path is the very same module: same names, same classes
