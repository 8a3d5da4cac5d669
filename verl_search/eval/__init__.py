"""Evaluation helpers behind ``python -m verl_search.report``: a run's plots. Offline tooling: it may import the
shared leaves, ``data`` and matplotlib; never verl's trainer, the tool or ``cpu``.
"""
