"""Search backends behind one interface (``search(queries, k) -> (scores, ids)``): exact flat inner product in torch,
any faiss index, and BM25.

Leaves of the service: they may import numpy, torch, faiss, bm25s, the corpus store and ``verl_search.atomic``;
nothing here knows about HTTP, batching or the tool. Loading readers report to ``local_dense_retriever.load_progress``.
"""
