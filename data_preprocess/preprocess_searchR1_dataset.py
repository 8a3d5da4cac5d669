"""Preprocess Search-R1 QA data into verl parquet files (thin CLI; the logic lives in ``verl_search.data``).

python data_preprocess/preprocess_searchR1_dataset.py --config data_preprocess/prompt.yaml --input_dir DIR
(or, from data_preprocess/: python preprocess_searchR1_dataset.py --config prompt.yaml)
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    from verl_search.data.cli import main
except ImportError:  # run from a source checkout without `pip install`: use the checkout's package
    sys.path.insert(0, str(HERE.parent))
    from verl_search.data.cli import main

if __name__ == "__main__":
    # a relative --config is looked for here too, so `--config prompt.yaml` works from the repo root as well
    sys.exit(main(default_config=HERE / "prompt.yaml", config_dirs=(HERE,)))
