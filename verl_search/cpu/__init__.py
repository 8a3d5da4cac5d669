"""The CPU backend for verl, read like another verl backend: the ``cpu`` platform (``platform``), the ``hf_cpu``
rollout backend (``rollout``: replica and in-worker adapter; ``rollout_server``: a batched transformers server;
``sampler``; ``options``), the bridges over verl 0.9's CPU gaps (``verl_gaps``), registration (``register``) and its
errors (``errors``).

May import verl, torch, transformers and the shared leaves; never the test kit (``verl_search.testing``): a test
opening policy reaches the rollout server only as a dotted path in ``engine_kwargs.hf_cpu.opening_policy``. Nothing in
the runtime plugin imports it except ``plugin.py``, which registers the backend only when ``VERL_PLATFORM=cpu`` asks.
The other modules here are forwarders kept for old import paths and commands (moved to ``verl_search.testing`` and
``verl_search.train``).
"""
