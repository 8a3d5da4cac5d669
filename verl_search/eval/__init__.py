"""Evaluation helpers behind ``python -m verl_search.report``: verl's validation dumps, a run's plots. Offline
tooling: it may import the shared leaves, ``data`` and pandas; never verl's trainer, the tool or ``cpu``.
"""
