"""Training health of a search run, per step: the search metrics (``step_metrics``), the trainers that log them
and watch them for collapse (``trainer``). May import verl and the runtime plugin's leaves; only verl's
trainer process imports it (through the plugin's import hook).
"""
