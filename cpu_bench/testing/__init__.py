"""The test kit: what tests, benchmarks and the scripted demo stand in for a model or a retriever with, and a kit
users may use for their own CI from a checkout.

- ``stub_retriever``: a tiny ``/retrieve`` server with fault modes (``python -m cpu_bench.testing.stub_retriever``);
- ``page_service``: the real retrieval service over a few rows and pages, searched by word overlap (``/access``);
- ``foreign_retrievers``: stand-ins for other projects' retrieval servers (Search-R1's reference server, SkyRL's);
- ``scripted_policy`` / ``scripted_rollout``: a scripted stand-in for verl's LLM server manager and a runner of verl's
  real agent loops with it (no language model runs);
- ``forced_prefix``: the CPU rollout server with forced openings (``engine_kwargs.hf_cpu.opening_policy``): it forces
  search calls and answers so a random tiny model exercises the tool path, and records what the server did;
- ``protocol_warm_start``: a tiny model warm-started to write both search protocols, for real rollout engines;
- ``scripted_demo``: ``make demo-scripted``, the retrieval pipeline through verl's agent loops with the scripted policy.

May import verl, the runtime plugin, ``verl_search.cpu`` (the backend's options and rollout server),
``verl_search.launch`` (the tool-YAML writer), ``cpu_bench.train`` (the local tokenizer, the SFT rows and trainer),
``cpu_bench.background_server`` and ``local_dense_retriever``. Nothing in ``verl_search`` imports it: a rollout
replica reaches the forcing server only through the dotted path a run's config names.
"""
