"""Training a small model to search on a CPU (``make train``): question splits, SFT warm-start trajectories from the
real retriever, verl's SFT trainer on the CPU backend, GRPO through ``main_ppo``, evaluation and plots, each stage a
``stage.Stage`` (name, key, folder, done marker, build); and the tiny
model's parts: the random Qwen2 writer (``tiny_model``, ``python -m verl_search.train.tiny_model``) and the locally
trained tokenizer (``local_tokenizer``).

Tooling: may import verl, the runtime plugin (tool, agent loops, reward), ``verl_search.data``, ``verl_search.eval``,
``verl_search.cpu``, ``verl_search.launch`` (the tool-YAML writer and the CPU run's override composers),
``verl_search.resources``, ``verl_search.testing`` (its background-server
helpers) and ``local_dense_retriever.toy``; nothing in the runtime plugin imports it.
"""
