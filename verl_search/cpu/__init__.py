"""The CPU backend for verl: the ``cpu`` platform, the ``hf_cpu`` rollout backend (``rollout``, ``rollout_server``,
``sampler``, ``options``), the bridges over verl's, vLLM's and SGLang's CPU gaps (``stand_ins`` serves absent
packages to SGLang's imports), the ``zmq`` ``checkpoint_engine``, and their registration (``register``, which
``plugin.py`` calls only when ``VERL_PLATFORM=cpu``).

May import verl, torch, transformers and the shared leaves; never ``cpu_bench`` (its test server reaches a replica
only as a dotted path in ``engine_kwargs.hf_cpu.opening_policy``).
"""
