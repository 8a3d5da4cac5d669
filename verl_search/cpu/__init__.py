"""The CPU backend for verl, read like another verl backend: the ``cpu`` platform (``platform``), the ``hf_cpu``
rollout backend (``rollout``: replica and in-worker adapter; ``rollout_server``, ``sampler``, ``options``), the
bridges over verl's and vLLM's CPU gaps (``verl_gaps``, ``vllm_gaps``), the ``zmq`` ``checkpoint_engine``, and
their registration (``register``); their errors are in ``verl_search.errors``.

May import verl, torch, transformers and the shared leaves; never the CPU test bench (``cpu_bench``): its test server
(a ``CpuRolloutServer`` subclass) reaches a replica only as a dotted path in ``engine_kwargs.hf_cpu.opening_policy``.
Nothing in the runtime plugin imports it except ``plugin.py``, which registers the backend only when
``VERL_PLATFORM=cpu`` asks.
"""
