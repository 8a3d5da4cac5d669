"""The one Python step a run script takes before verl: its knobs checked, the overrides it cannot write literally added,
the run folder's tool config written and the preflight run on the whole command, printed as ``VS_ARGS=(...)`` for the
script to eval (``run_scripts/common.sh``'s ``vs_prepare``).

Usage: ``python -m verl_search.launch.prepare RECIPE [--knobs-only [--notes]] [--dry-run] [--skip-preflight]
[--probe-timeout S] [--user N] -- OVERRIDES...``: the script's literal overrides, then the user's ``N`` trailing ones;
the added overrides go between them, so the user's still win. The knobs are read from the environment (the script
exports them); the flags are ``common.sh``'s ``DRY_RUN``, ``SKIP_PREFLIGHT`` and ``PROBE_TIMEOUT``, as
``vs_prepare`` passes them. ``--knobs-only`` prints the recipe's notes only with ``--notes`` (a script that hands
the run to another one), so a script that checks its knobs early does not print them twice.

Invariant: a bad knob is one ``error:`` line naming it, exit 1, and nothing written; the user's overrides come last.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from verl_search.errors import ConfigError, KnobError
from verl_search.launch import cpu_recipe, eval_recipe, gpu_recipe
from verl_search.launch.preflight import quiet_imports, run_preflight, summarise
from verl_search.launch.tool_yaml import RUN_TOOL_YAML, parse_urls, write_tool_config

RECIPES = {
    "gpu": (gpu_recipe.GpuKnobs, gpu_recipe.derived_overrides),
    "cpu": (cpu_recipe.CpuKnobs, cpu_recipe.derived_overrides),
    "eval": (eval_recipe.EvalKnobs, eval_recipe.derived_overrides),
}


def _fail(*lines: str) -> None:
    for line in lines:
        print(f"error: {line}", file=sys.stderr)


def prepare(
    recipe: str,
    overrides: list[str],
    user: int,
    env: Mapping[str, str],
    *,
    knobs_only: bool = False,
    show_notes: bool = False,
    dry_run: bool = False,
    skip_preflight: bool = False,
    probe_timeout: float = 10.0,
) -> str | None:
    """What ``main`` does: the ``VS_ARGS=(...)`` line for the script, or None after printing why it cannot launch."""
    knobs_cls, derive = RECIPES[recipe]
    try:
        knobs = knobs_cls.from_env(env)
        added, notes = derive(knobs, env)
    except KnobError as e:
        return _fail(str(e), "fix the knob named above")
    for note in notes if show_notes or not knobs_only else ():
        print(note, file=sys.stderr)
    if knobs_only:
        return ""
    source, dest = Path(knobs.tool_config), Path(knobs.run_dir) / RUN_TOOL_YAML
    try:
        write_tool_config(source, dest, parse_urls(knobs.retriever_url))
    except (ConfigError, OSError) as e:
        return _fail(str(e), f"cannot write the run's tool config {dest} from {source}")
    split = len(overrides) - user
    args = [*overrides[:split], *added, *overrides[split:]]
    if skip_preflight:
        print("warning: SKIP_PREFLIGHT=1: launching without checks", file=sys.stderr)
    else:
        quiet_imports()
        findings = run_preflight(
            args,
            dry_run=dry_run,
            expected_agent=knobs.expected_agent,
            probe_timeout=probe_timeout,
            record_run=not dry_run,
        )
        if not summarise(findings):
            return _fail("preflight failed: fix the problems listed above (DRY_RUN=1 runs only the checks)")
    return "VS_ARGS=(" + " ".join(map(shlex.quote, args)) + ")\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m verl_search.launch.prepare", description=__doc__.split("\n")[0])
    p.add_argument("recipe", choices=sorted(RECIPES))
    p.add_argument("--knobs-only", action="store_true", help="check the knobs and stop (before a Ray fleet starts)")
    p.add_argument("--notes", action="store_true", help="with --knobs-only: print the recipe's notes too")
    p.add_argument("--dry-run", action="store_true", help="the preflight's dry run: missing GPUs are a warning")
    p.add_argument("--skip-preflight", action="store_true", help="add the overrides and write the tool config only")
    p.add_argument("--probe-timeout", type=float, default=10.0, help="seconds for the retriever probe")
    p.add_argument("--user", type=int, default=0, help="how many of the overrides are the user's (the last ones)")
    args = p.parse_args(argv[:split])
    overrides = argv[split + 1 :]
    if not 0 <= args.user <= len(overrides):
        p.error(f"--user {args.user}: there are {len(overrides)} overrides")
    # everything but the VS_ARGS line goes to stderr, verl's and its libraries' prints included, so the script's eval
    # reads only that line
    sys.stdout.flush()
    script_out = os.dup(1)
    os.dup2(2, 1)
    line = prepare(
        args.recipe,
        overrides,
        args.user,
        os.environ,
        knobs_only=args.knobs_only,
        show_notes=args.notes,
        dry_run=args.dry_run,
        skip_preflight=args.skip_preflight,
        probe_timeout=args.probe_timeout,
    )
    sys.stdout.flush()
    if line is None:
        return 1
    os.write(script_out, line.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
