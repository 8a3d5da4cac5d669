"""Preprocessing behind ``data_preprocess/preprocess_searchR1_dataset.py``: Search-R1 parquet files → verl rows
(``sources``, ``schema``, prompt ``templates``, the ``rows`` they make, the ``pipeline`` that writes them, ``cli``).

Offline tooling: it may import pandas/pyarrow, the agent-loop names and the shared leaves; nothing at rollout time
imports it.
"""
