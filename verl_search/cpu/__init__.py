"""The CPU backend for verl, read like another verl backend: the ``cpu`` platform (``platform``), the ``hf_cpu``
rollout backend (``rollout``: replica and in-worker adapter; ``rollout_server``: a batched transformers server;
``sampler``; ``options``), the bridges over verl 0.9's CPU gaps (``verl_gaps``), registration (``register``) and its
errors (``errors``), the bridges for vLLM's CPU build (``vllm_gaps``) and the ``zmq`` checkpoint engine
(``checkpoint_engine``).

May import verl, torch, transformers and the shared leaves; never the CPU test bench (``cpu_bench``): a test opening
policy reaches the rollout server only as a dotted path in ``engine_kwargs.hf_cpu.opening_policy``. Nothing in the
runtime plugin imports it except ``plugin.py``, which registers the backend only when ``VERL_PLATFORM=cpu`` asks.
"""
