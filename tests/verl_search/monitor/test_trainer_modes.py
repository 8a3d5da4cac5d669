"""The search trainer modes are registered in verl's own trainer registry by ``import verl`` (our plugin) and are
verl's trainers of the same mode; guards fail when verl changes what the metrics hook relies on."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

verl_v1 = pytest.importorskip("verl.trainer.ppo.v1")


def test_import_verl_registers_a_search_trainer_for_every_v1_mode():
    code = (
        "import verl\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl_search.monitor.trainer import SEARCH_MODES, SearchMetricsMixin\n"
        "for name, base in SEARCH_MODES.items():\n"
        "    cls = get_trainer_cls(name)\n"
        "    assert issubclass(cls, SearchMetricsMixin) and issubclass(cls, get_trainer_cls(base)), name\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_config_keeps_verls_own_mode_name():
    """verl compares trainer_mode with "sync": our trainer hands verl its own mode name before verl reads it."""
    from omegaconf import OmegaConf

    from verl_search.monitor.trainer import SearchMetricsMixin

    class Base:
        def __init__(self, config) -> None:
            self.mode_seen = config.trainer.v1.trainer_mode

    class Trainer(SearchMetricsMixin, Base):
        pass

    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "search_sync"}}})
    OmegaConf.set_struct(config, True)
    assert Trainer(config).mode_seen == "sync"


def test_guard_verl_metrics_hook_is_what_we_override():
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, PPOTrainer

    assert set(TRAINER_REGISTRY) >= {"sync", "colocate_async", "separate_async"}
    params = list(inspect.signature(PPOTrainer._compute_metrics).parameters)
    assert params == ["self", "batch", "metrics", "timing_raw", "global_steps", "epoch"]
    source = inspect.getsource(PPOTrainer.fit)  # the step's metrics are computed, then logged, in this order
    assert source.index("self._compute_metrics(") < source.index("self.logger.log(data=metrics")
    import transfer_queue as tq

    assert "select_fields" in inspect.signature(tq.kv_batch_get).parameters
    from verl.trainer.ppo.v1 import agent_loop_tq

    assert 'extra_fields["reward_extra_info"]' in inspect.getsource(agent_loop_tq)  # the reward's keys reach us


def test_verls_replay_buffer_still_polls_every_two_seconds_and_takes_a_new_interval():
    """The guard of SYNC_POLL_INTERVAL_S: verl's ReplayBuffer defaults to 2 s between checks and sleeps whatever its
    ``poll_interval`` attribute says (if either changes, the override must be revisited)."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from verl_search.monitor.trainer import VERL_POLL_INTERVAL_S

    assert inspect.signature(ReplayBuffer.__init__).parameters["poll_interval"].default == VERL_POLL_INTERVAL_S
    assert "time.sleep(self.poll_interval)" in inspect.getsource(ReplayBuffer._wait_for_next_poll)


@pytest.mark.parametrize(("mode", "interval"), [("sync", 0.1), ("colocate_async", 2.0), ("separate_async", 2.0)])
def test_only_the_synchronous_trainer_polls_faster(mode, interval):
    from types import SimpleNamespace

    from verl_search.monitor.trainer import SYNC_POLL_INTERVAL_S, SearchMetricsMixin

    class Base:
        def _build_replay_buffer(self):
            return SimpleNamespace(poll_interval=2.0)

    class Trainer(SearchMetricsMixin, Base):
        def __init__(self) -> None:  # verl sets trainer_mode in its own __init__, before building the buffer
            self.trainer_mode = mode

    assert Trainer()._build_replay_buffer().poll_interval == interval
    assert SYNC_POLL_INTERVAL_S == 0.1
