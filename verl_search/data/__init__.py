"""Preprocessing behind ``data_preprocess/preprocess_searchR1_dataset.py``: Search-R1 parquet files → verl rows.
Offline tooling: it may import pandas/pyarrow and the shared leaves; nothing at rollout time imports it.
"""
