"""The CPU test bench: what runs the recipe without GPUs, for us and for users who want to try it on a laptop; it
lives in the repository and is not part of the wheel.

- ``train/``: ``make train`` / ``make demo`` (the toy-world pipeline: question splits, the tiny model and its local
  tokenizer, the shipped base model, SFT, GRPO through ``main_ppo`` on the CPU backend, evaluation and plots);
- ``testing/``: the test kit (stub and foreign retrievers, scripted policy and rollout, forced openings, the protocol
  warm start, ``make demo-scripted``);
- ``gpu_smoke``: ``make gpu-smoke``, two GRPO steps of the GPU recipe's script against the toy world's retriever;
- ``background_server``: servers and subprocesses in the background for both (``free_port``,
  ``wait_until_healthy``, ``BackgroundServer``).

May import anything of ``verl_search`` and ``local_dense_retriever``; ``verl_search`` never imports it (verl reaches
the test kit only through dotted paths a run's config names). Inside it, ``testing`` may import ``train``, never
the reverse.
"""
