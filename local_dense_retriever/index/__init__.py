"""Search backends behind one interface (``base``): exact flat inner product in torch (its shards behind the scan
interface of ``scan``), any faiss index, and BM25. Leaves of the service: they may import numpy, torch, faiss, bm25s,
the corpus store, ``load_progress``, ``config`` (the backend rule), ``memory``, ``errors`` and ``verl_search.atomic``;
nothing here knows about HTTP or batching."""
