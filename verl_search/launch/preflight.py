"""Launch preflight: compose verl's config with the launch overrides and check everything a run needs, before GPUs.

Usage: ``python -m verl_search.launch.preflight [--dry-run] [--agent NAME] -- key=value ...`` (the overrides that will
be given to ``python -m verl.trainer.main_ppo``). Invariant: every problem found is printed as one ``preflight: ERROR``
line naming its cause, all checks run even after a failure, and the exit status is non-zero iff there was an error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from verl_search.launch import checks, run_inputs, run_outputs, runtime, trainer_mode
from verl_search.launch.checks import LaunchContext, PreflightError, PreflightWarning
from verl_search.launch.environment import InstalledEnvironment
from verl_search.launch.run_outputs import RunRecord, write_record
from verl_search.launch.trainer_config import LaunchConfigError, compose_launch_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finding:
    """The outcome of one check: ``level`` is ok, warning or error."""

    level: str
    check: str
    message: str

    def line(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else "(no detail)"
        return f"preflight: {self.level.upper():<7} {self.check}: {first}"


def planned_checks(ctx: LaunchContext) -> list[tuple[str, Callable[[], str]]]:
    """Every check for this config, in the order a user would fix them."""
    data = ctx.config.data
    plan: list[tuple[str, Callable[[], str]]] = []
    for role, key in (("train", "train_files"), ("val", "val_files")):
        files = checks.as_list(data.get(key))
        if not files:
            plan.append((f"data.{key}", lambda key=key: _raise(f"data.{key} is empty")))
        for path in files:
            plan.append((f"data.{key}", lambda path=path, role=role: checks.check_data_file(ctx, path, role)))
    plan += [
        ("rollout engine", lambda: checks.check_rollout_engine(ctx)),
        ("engine install", lambda: runtime.check_engine_installed(ctx)),
        ("locked versions", lambda: runtime.check_locked_versions(ctx)),
        ("cuda driver", lambda: runtime.check_cuda_driver(ctx)),
        ("stop strings", lambda: runtime.check_stop_strings(ctx)),
        ("attention", lambda: runtime.check_attention(ctx)),
        ("tool parser", lambda: checks.check_tool_parser(ctx)),
        ("verl validation", lambda: checks.check_verl_validation(ctx)),
        ("trainer mode", lambda: trainer_mode.check_trainer_mode(ctx)),
        ("agent loops", lambda: checks.check_agent_loops(ctx)),
        ("tools", lambda: run_inputs.check_tools_build(ctx)),
        ("tool response length", lambda: run_inputs.check_tool_response_length(ctx)),
    ]
    try:
        urls = run_inputs.retriever_urls(ctx)
    except PreflightError as e:  # the cause is reported by the "tools" check
        urls = []
        plan.append(("retriever", lambda e=e: _raise(f"not probed: {e}", PreflightWarning)))
    for url in urls:
        plan.append(("retriever", lambda url=url: run_inputs.probe_retriever(url, ctx.probe_timeout)))
        plan.append(("retriever gpus", lambda url=url: run_inputs.check_retriever_gpus(ctx, url)))
    plan += [
        ("reward", lambda: run_inputs.check_reward(ctx)),
        ("tokenizer", lambda: run_inputs.check_tokenizer(ctx)),
        ("checkpoint", lambda: run_outputs.check_checkpoint(ctx)),
        ("checkpoint disk", lambda: run_outputs.check_checkpoint_disk(ctx)),
        ("wandb", lambda: run_outputs.check_wandb(ctx)),
        ("gpus", lambda: run_inputs.check_gpus(ctx)),
    ]
    return plan


def _raise(message: str, kind: type[PreflightError] = PreflightError) -> str:
    raise kind(message)


def run_check(name: str, check: Callable[[], str]) -> Finding:
    """Run one check; this is the one place where check errors become findings."""
    try:
        return Finding("ok", name, check())
    except PreflightWarning as e:
        return Finding("warning", name, str(e))
    except PreflightError as e:
        return Finding("error", name, str(e))
    except Exception as e:  # a check that breaks must not hide the others
        logger.debug("check %s crashed", name, exc_info=True)
        return Finding("error", name, f"check failed unexpectedly: {type(e).__name__}: {e}")


def run_preflight(
    overrides: list[str],
    *,
    dry_run: bool = False,
    expected_agent: str | None = None,
    probe_timeout: float = 10.0,
    out: TextIO | None = None,
    environment: InstalledEnvironment | None = None,
    record_run: bool = False,
) -> list[Finding]:
    """Compose the config and run every check, printing one line per finding to ``out``; return the findings.

    ``environment`` answers the questions about installed software (default: this interpreter's). ``record_run``: when
    no check failed, mark the checkpoint folder as this experiment's (the launch goes ahead), which the checkpoint
    check of a later launch into the same folder reads.
    """
    out = out or sys.stderr
    findings: list[Finding] = []

    def report(finding: Finding) -> None:
        findings.append(finding)
        print(finding.line(), file=out, flush=True)

    try:
        composed = compose_launch_config(overrides)
    except LaunchConfigError as e:
        report(Finding("error", "config", str(e)))
        return findings
    for message in composed.unknown_key_messages():
        report(Finding("error", "config", message))
    if not composed.unknown_keys:
        report(Finding("ok", "config", f"{len(overrides)} overrides compose with the installed verl's ppo_trainer"))
    ctx = LaunchContext(composed.config, dry_run=dry_run, expected_agent=expected_agent, probe_timeout=probe_timeout)
    if environment is not None:
        ctx.environment = environment
    for name, check in planned_checks(ctx):
        report(run_check(name, check))
    if record_run and not any(f.level == "error" for f in findings):
        trainer = composed.config.trainer
        record = RunRecord(project_name=str(trainer.project_name), experiment_name=str(trainer.experiment_name))
        try:
            path = write_record(Path(str(trainer.default_local_dir)), record)
            report(Finding("ok", "run record", f"{path}: experiment '{record.experiment_name}' writes here"))
        except OSError as e:
            report(Finding("error", "run record", f"cannot write {trainer.default_local_dir}: {e}"))
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verl_search.launch.preflight",
        description="Check a verl-search launch (config keys, data, tools, retriever, reward, model, GPUs).",
    )
    parser.add_argument("--dry-run", action="store_true", help="missing GPUs are a warning, not an error")
    parser.add_argument("--agent", help="the agent loop every data row must use (tool_agent or search_r1_agent)")
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="seconds for the retriever probe")
    parser.add_argument(
        "--record-run",
        action="store_true",
        help="when every check passes, record the experiment in its checkpoint folder",
    )
    parser.add_argument("overrides", nargs="*", help="hydra overrides for verl.trainer.main_ppo (after --)")
    args = parser.parse_args(argv)
    quiet_imports()
    findings = run_preflight(
        args.overrides,
        dry_run=args.dry_run,
        expected_agent=args.agent,
        probe_timeout=args.probe_timeout,
        record_run=args.record_run,
    )
    return 0 if summarise(findings) else 1


def quiet_imports() -> None:
    """Warnings as one line each, and none of verl's import-time warnings, which would drown the findings."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore")


def summarise(findings: list[Finding], out: TextIO | None = None) -> bool:
    """Print the preflight's last line (passed, or failed with how many errors); return whether it passed."""
    out = out or sys.stderr
    errors = sum(f.level == "error" for f in findings)
    warned = sum(f.level == "warning" for f in findings)
    if errors:
        print(f"preflight: FAILED with {errors} error(s), {warned} warning(s)", file=out)
        return False
    print(f"preflight: passed ({warned} warning(s))", file=out)
    return True


if __name__ == "__main__":
    sys.exit(main())
