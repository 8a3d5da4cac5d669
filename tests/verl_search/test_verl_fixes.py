"""The plugin's bridge over verl 0.9.1's separate_async logging bug: the installed verl still has it (this test fails
once upstream fixes it: then drop the bridge), and with the plugin loaded the trainer module logs it."""

from __future__ import annotations

import logging

import verl  # noqa: F401  (loads our verl.plugins entry point, as every verl process does)
import verl.trainer.ppo.v1.trainer_separate_async as separate_async

from verl_search.plugin import has_bug


def test_installed_verl_still_logs_with_prints_flush_keyword():
    assert has_bug(separate_async), "verl fixed PPOTrainerSeparateAsync._setup's logger.info(flush=True): drop the fix"


def test_with_the_plugin_the_separate_async_trainer_can_log_its_setup(caplog):
    with caplog.at_level(logging.INFO, logger=separate_async.__name__):
        separate_async.logger.info("[V1SepAsync] hybrid replicas disabled", flush=True)  # what _setup does
    assert "[V1SepAsync] hybrid replicas disabled" in caplog.text
