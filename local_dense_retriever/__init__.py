"""The retrieval service: FastAPI app → batcher → engine → encoder and search backends (``index/``) over a
memory-mapped corpus store, configured once in ``config.ServerConfig``; ``retrieval_server.py`` is its CLI.

``toy/`` generates the toy world and the embedded default; ``artifacts/`` downloads and builds what the service
reads. The service may import the shared leaves ``verl_search.protocol``, ``verl_search.atomic`` and
``verl_search.pacing``; it never imports
the tool (``verl_search.tool``), the agent loops or verl.
"""
