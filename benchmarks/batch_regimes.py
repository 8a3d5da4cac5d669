"""The batcher's regime under closed-loop load, over time: queries/s, batches/s, mean batch, CPU of server and clients.

    python benchmarks/retriever_soak.py ...                       # memory; this one watches the batch size
    python benchmarks/batch_regimes.py [--minutes 7] [--clients 64] [--sample_s 15] [-- <server flags>]
    python benchmarks/batch_regimes.py --minutes 2 --stagger_ms 20 --tree /tmp/before   # two cohorts, another tree

C closed-loop single-query clients (this process) against the batched server on the 100k-passage toy corpus (as
``retriever_load.py``). Every sample: the queries answered and batches run since the last one (their mean batch),
the server's and this process's CPU in cores (``/proc``), and the server's busiest threads. It shows whether the
clients stay in one cohort (batches of C) or split into cohorts that the batcher serves in turn. ``--stagger_ms``
starts the second half of the clients that much later: two cohorts from the start, which the batcher should merge.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import retriever_load  # noqa: E402
from retriever_load import prepare, server_metrics, toy_questions  # noqa: E402
from retriever_soak import sampled_closed_loop  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str, task: str | None = None) -> float:
    path = f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime


def thread_seconds(pid: int) -> dict[str, float]:
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out[task] = cpu_seconds(pid, task)
        except OSError:  # the thread ended
            pass
    return out


async def watch(
    url: str, pid: int, questions: list[str], clients: int, minutes: float, sample_s: float, stagger_s: float
) -> None:
    def snapshot(answered: int) -> tuple:
        return (time.perf_counter(), answered, cpu_seconds(pid), cpu_seconds(os.getpid()),
                server_metrics(url)["batches_total"], thread_seconds(pid))  # fmt: skip

    last = [await asyncio.to_thread(snapshot, 0)]

    async def on_sample(t_s: float, answered: int, errors: int) -> None:
        now, before = await asyncio.to_thread(snapshot, answered), last[0]
        dt = now[0] - before[0]
        batches = now[4] - before[4]
        busiest = sorted(((now[5][t] - before[5].get(t, 0.0)) / dt for t in now[5]), reverse=True)[:3]
        print(f"{t_s:5.0f} {(now[1] - before[1]) / dt:7.1f} {batches / dt:9.1f} "
              f"{(now[1] - before[1]) / max(batches, 1):10.1f} {(now[2] - before[2]) / dt:12.2f} "
              f"{(now[3] - before[3]) / dt:13.2f}  {', '.join(f'{c:.2f}' for c in busiest)}  {errors:6d}",
              flush=True)  # fmt: skip
        last[0] = now

    print(f"{'t s':>5} {'q/s':>7} {'batches/s':>9} {'mean batch':>10} {'server cores':>12} {'clients cores':>13}  "
          f"busiest server threads (cores), errors")  # fmt: skip
    await sampled_closed_loop(url, questions, clients, minutes, sample_s, on_sample, stagger_s)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=7.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--sample_s", type=float, default=15.0)
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="server torch threads")
    p.add_argument("--stagger_ms", type=float, default=0.0, help="start the second half of the clients this late")
    p.add_argument("--tree", type=Path, default=None, help="serve from this source tree (default: this one)")
    p.add_argument("server_flags", nargs="*", help="extra server flags, after --")
    args = p.parse_args()
    server = retriever_load.server_script(p, args.tree) if args.tree is not None else retriever_load.SERVER
    corpus, npy, _, kind = prepare(args.passages, "auto")
    served = retriever_load.serving(corpus, npy, "torch", True, args.threads, "auto", *args.server_flags, server=server)
    with served as (proc, url):
        now = datetime.now(timezone.utc)
        print(f"# batch regimes: {args.passages:,} passages ({kind} vectors), C={args.clients}, {os.cpu_count()} "
              f"CPUs, server flags {args.server_flags or 'default'}, {now:%Y-%m-%d %H:%M} UTC")  # fmt: skip
        asyncio.run(watch(url, proc.pid, toy_questions(corpus), args.clients, args.minutes, args.sample_s,
                          args.stagger_ms / 1000))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
