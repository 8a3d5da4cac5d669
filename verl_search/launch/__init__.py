"""Tooling the run scripts call before verl starts: each script's knobs and the overrides it cannot write literally
(``script_knobs``, ``gpu_recipe``, ``cpu_recipe``, ``eval_recipe``, ``attention``, ``trainer_mode``), the one step
every script takes before verl (``prepare``), the tool-YAML writer, and the preflight (``preflight``) with its checks
(``checks``, ``runtime``, ``run_inputs``, ``run_outputs``, ``trainer_mode``). Every check returns a one-line note
when fine and raises a ``PreflightError`` (or ``PreflightWarning``) otherwise; none writes, downloads or starts
anything.

Runs in the user's shell, never inside a rollout worker: it may import verl, the tool's config and the shared leaves;
nothing in ``tool``, the agent loops or the reward imports it.
"""
