"""Opt-in CPU acceleration behind the index-scan interface (``index.scan``): the pre-scan of a float32 flat index on
the CPU in a bf16 or int8 copy, chosen by ``--index_prefilter`` under the rule of ``accel.rule``.

May import the core's leaves (``index.scan``, ``index.topk``, ``index.flat_file``, ``config``, ``errors``) and
torch; the core imports only ``accel.rule.prescan_for`` and ``accel.rule.chosen_copy``, where it loads an index.
"""
