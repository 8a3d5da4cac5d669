"""Training health of a search run, per step: the rollouts' search behaviour as trainer metrics (``step_metrics``),
the trainer classes that log them every step (``trainer``: ``trainer.v1.trainer_mode=search_sync``), and the alarms
that recognise a collapsing run from them (``alarms``).

May import verl and the runtime plugin's leaves (``tool.search_tool``'s stats keys); verl's trainer process imports it
through the plugin's import hook, so nothing here is imported by rollout workers.
"""
