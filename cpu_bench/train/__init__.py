"""Training a small model to search on a CPU (``make train``, ``make demo``): question splits, SFT warm-start
trajectories from the real retriever, verl's SFT trainer on the CPU backend, GRPO through ``main_ppo``, evaluation and
plots, each stage a ``stage.Stage`` (name, key, folder, done marker, build); the tiny model's parts: the random Qwen2
writer (``tiny_model``, ``python -m cpu_bench.train.tiny_model``) and the locally trained tokenizer
(``local_tokenizer``); and the base model shipped in ``shipped_base_model/`` (``make base-model``).

May import verl, the runtime plugin (tool, agent loops, reward), ``verl_search.data``, ``verl_search.eval``,
``verl_search.cpu``, ``verl_search.launch`` (the tool-YAML writer and the CPU run's override composers),
``verl_search.resources``, ``cpu_bench.background_server`` and ``local_dense_retriever.toy``; never
``cpu_bench.testing``.
"""
