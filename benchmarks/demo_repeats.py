"""How often `make demo` learns: run it N times (the warm start reused, GRPO redone) per setting and tabulate.

    python benchmarks/demo_repeats.py --runs 6                                  # the defaults
    python benchmarks/demo_repeats.py --runs 6 --arm t1.0="--temperature 1.0"   # the defaults and an alternative
    python benchmarks/demo_repeats.py --logs LOG [LOG ...]                      # tabulate logs of earlier runs

Runs alternate between the settings (arm A run 1, arm B run 1, arm A run 2, ...), so a drift of the machine's speed
touches every arm alike. Each run's console is kept in ``--dir``; the table comes from those logs: held-out EM after SFT
and after GRPO, the paired gain and its standard error, searches per sampled trajectory at each GRPO step, the run's
time. A run "learns" when its gain is at least 3 standard errors.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GAIN = re.compile(r"GRPO gain: ([+-][\d.]+) EM, standard error ([\d.]+)")
ROW = re.compile(r"^\| after (SFT|GRPO) \|[^|]*\| ([\d.]+) \|", re.M)
STEP = re.compile(r"step (\d+)/\d+: reward ([\d.]+), searches/trajectory ([\d.]+)")
TOTAL = re.compile(r"total (\d+) s")
VALIDATION = re.compile(r"validation reward ([\d.]+)")


@dataclass
class Run:
    arm: str
    log: Path
    em_sft: float = float("nan")
    em_grpo: float = float("nan")
    gain: float = float("nan")
    se: float = float("nan")
    searches: list[float] = field(default_factory=list)
    seconds: float = float("nan")
    last_validation: float = float("nan")  # verl's validation reward at the last step: a mean over the data sources

    @property
    def learned(self) -> bool:
        return self.gain >= 3 * self.se


def parse(arm: str, log: Path) -> Run:
    text = log.read_text(errors="replace")
    run = Run(arm, log)
    rows = dict(ROW.findall(text))
    run.em_sft, run.em_grpo = float(rows.get("SFT", "nan")), float(rows.get("GRPO", "nan"))
    if m := GAIN.search(text):
        run.gain, run.se = float(m[1]), float(m[2])
    run.searches = [float(s) for _, _, s in STEP.findall(text)]
    if m := TOTAL.search(text):
        run.seconds = float(m[1])
    if found := VALIDATION.findall(text):
        run.last_validation = float(found[-1])
    return run


def table(runs: list[Run]) -> str:
    columns = ["setting", "run", "EM after SFT", "EM after GRPO", "gain ± s.e.", "gain / s.e."]
    columns += ["validation reward, last step", "searches per sampled trajectory, step 1 → last", "run time"]
    out = ["| " + " | ".join(columns) + " |", "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    count: dict[str, int] = {}
    for r in runs:
        count[r.arm] = count.get(r.arm, 0) + 1
        curve = ", ".join(f"{s:.2f}" for s in r.searches)
        ratio = r.gain / r.se if r.se else float("nan")
        out.append(f"| {r.arm} | {count[r.arm]} | {r.em_sft:.2f} | {r.em_grpo:.2f} | {r.gain:+.2f} ± {r.se:.3f} | "
                   f"{ratio:.1f} | {r.last_validation:.2f} | {curve} | {r.seconds:.0f} s |")  # fmt: skip
    out.append("")
    for arm in dict.fromkeys(r.arm for r in runs):
        mine = [r for r in runs if r.arm == arm and r.se == r.se]  # runs that printed their gain
        gains = [r.gain for r in mine]
        learned = sum(r.learned for r in mine)
        mean = sum(gains) / len(gains) if gains else float("nan")
        first = [r.searches[0] for r in runs if r.arm == arm and r.searches]
        low, high = min(gains, default=float("nan")), max(gains, default=float("nan"))
        step1 = sum(first) / max(len(first), 1)
        out.append(f"{arm}: learned (gain >= 3 s.e.) in {learned} of {len(mine)} runs; mean gain {mean:+.3f}, range "
                   f"{low:+.2f} .. {high:+.2f}; searches per sampled trajectory at step 1: {step1:.2f}")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4, help="runs per setting")
    what = "a setting: a name and the arguments make demo passes to cpu_bench.train (TRAIN_ARGS)"
    p.add_argument("--arm", action="append", default=[], metavar='NAME="ARGS"', help=what)
    p.add_argument("--no_default", action="store_true", help="run only the --arm settings, not the defaults")
    p.add_argument("--dir", type=Path, default=REPO / ".cache" / "demo_repeats", help="where each run's log is kept")
    p.add_argument("--logs", nargs="+", type=Path, help="tabulate these logs (NAME=LOG or LOG) instead of running")
    args = p.parse_args()
    if args.logs:
        pairs = [str(x).split("=", 1) if "=" in str(x) else ("default", str(x)) for x in args.logs]
        print(table([parse(name, Path(log)) for name, log in pairs]))
        return 0
    arms = ([] if args.no_default else [("default", "")]) + [tuple(a.split("=", 1)) for a in args.arm]
    args.dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(1, args.runs + 1):
        for name, extra in arms:
            log = args.dir / f"{name}_{i}_{time.strftime('%Y%m%d-%H%M%S')}.log"
            command = ["make", "-C", str(REPO), "demo", f"TRAIN_ARGS={extra}"]
            print(f"# {shlex.join(command)} > {log}", flush=True)
            with open(log, "w") as f:
                subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False)
            runs.append(parse(name, log))
            print(table(runs).splitlines()[1 + len(runs)], flush=True)  # this run's row
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
