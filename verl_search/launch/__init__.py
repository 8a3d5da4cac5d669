"""Tooling the run scripts call before verl starts: the launch preflight and its checks, the trainer-config composer,
the trainer knob (``trainer_mode``: TRAINER=sync|one_step_off|fully_async|colocate_async) and the tool-YAML writer.

Runs in the user's shell, never inside a rollout worker: it may import verl, the tool's config and the shared leaves;
nothing in ``tool``, the agent loops or the reward imports it.
"""
