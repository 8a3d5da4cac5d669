"""``python -m local_dense_retriever.serve``: see ``cli``."""

import sys

from local_dense_retriever.serve.cli import main

sys.exit(main())
