"""Evaluation helpers behind ``python -m verl_search.report``: reading verl's validation dumps, drawing a run's plots.

Offline tooling: it may import the shared leaves, ``data`` (its parquet reader, how rows name their data source) and
pandas; it never imports verl's trainer, the tool or ``cpu``.
"""
