"""make train's child processes: a killed pipeline ends its stages' process groups instead of orphaning them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_the_pipeline_ends_the_running_stage_and_its_children(tmp_path: Path) -> None:
    log = tmp_path / "stage.log"
    # the stage: a shell that starts a grandchild (as Ray starts workers) and prints both pids, then waits
    stage = "sleep 300 & echo $$ $!; wait"
    driver = textwrap.dedent(
        f"""
        from pathlib import Path
        from cpu_bench.train.processes import exit_on_sigterm, run_stage
        exit_on_sigterm()
        run_stage("stage", ["sh", "-c", {stage!r}], Path({str(log)!r}))
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO)  # the bench imports from the checkout
    try:

        def output() -> list[str]:  # what the stage printed, after the command that heads the log
            return log.read_text().split("\n\n", 1)[-1].split() if log.is_file() else []

        assert _wait_for(lambda: len(output()) == 2), "the stage did not start"
        pids = [int(p) for p in output()]
        assert all(_alive(p) for p in pids)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 128 + signal.SIGTERM
        assert _wait_for(lambda: not any(_alive(p) for p in pids)), "the stage's processes outlived the pipeline"
    finally:
        parent.kill()
