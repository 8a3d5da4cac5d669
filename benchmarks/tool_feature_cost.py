"""What each of the tool's safety features costs per call (issue 29.7): the tool with every feature on, then with one
switched off at a time, against the same instant stub, plus the pure-Python steps of a call timed alone.

    python benchmarks/tool_feature_cost.py [--trajectories 512] [--calls 4] [--rounds 5] [--gc_freeze]

The load is benchmarks/tool_overhead.py's (``--trajectories`` concurrent trajectories of ``--calls`` sequential calls,
every query new, the stub in its own process on the other core). "Every feature on" is the tool's defaults: the rate
limiter (its rate raised so it never makes a call wait: what is measured is its bookkeeping), the worker pool of 120,
the result cache and in-flight coalescing, the deadline, retries, argument checks, formatting and counters. Rounds
visit the variants in turn, so each round's variants share the machine's state; a variant's cost per call is the
difference of the median rounds' seconds per call. The client process is one thread on one core, so seconds per call
at full load are its CPU time per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from datetime import datetime, timezone
from pathlib import Path

from bare_client import run_bare
from tool_overhead import against_stub, run_tool

from local_dense_retriever.precision_cache import cpu_model
from verl_search import SearchTool
from verl_search.protocol import Document
from verl_search.tool.arguments import extract_queries, fit_queries
from verl_search.tool.client import RetrievalClient
from verl_search.tool.formatting import format_results
from verl_search.tool.stats import STATS

#: the tool's defaults with the limiter's rate out of reach; each variant switches one feature off
ALL_ON = {"type": "native", "rate_limit": 1e9, "stats_log_interval": 0}
VARIANTS = {
    "every feature on": {},
    "rate limiter off": {"rate_limit": None},
    "worker pool off (num_workers 100000)": {"num_workers": 100_000},
    "cache and coalescing off": {"cache_size": 0},
    "all three off": {"rate_limit": None, "num_workers": 100_000, "cache_size": 0},
}


def micro_costs() -> dict[str, float]:
    """Microseconds per call of the pure-Python steps of one call, each timed alone."""
    hits = [[Document(id=str(i), contents=f'"Title {i}"\nSome passage text about title {i}. ' * 3) for i in range(3)]]
    STATS.log_interval = 0
    steps = {
        "arguments: extract and fit the queries": lambda: fit_queries(
            extract_queries({"query_list": ["who wrote the toy question?"]}), max_queries=8, max_query_chars=512
        ),
        "format 3 passages for the model": lambda: format_results(["q"], hits, max_chars=6000),
        "counters (STATS.record_call)": lambda: STATS.record_call(latency_s=0.001, num_queries=1, failure=None),
    }
    out = {}
    for name, step in steps.items():
        n = 20_000
        out[name] = min(timeit.repeat(step, number=n, repeat=3)) / n * 1e6
    return out


async def measure(args: argparse.Namespace, url: str) -> dict:
    tools = {name: SearchTool({**ALL_ON, **change, "retrieval_service_url": url, "gc_freeze": args.gc_freeze})
             for name, change in VARIANTS.items()}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "bare aiohttp client (same process)"]}
    failures = 0
    for r in range(args.rounds):
        elapsed, lat = await run_bare(url, args.trajectories, args.calls, f"bare{r}")
        rates["bare aiohttp client (same process)"].append(len(lat) / elapsed)
        for name, tool in tools.items():
            elapsed, lat, failed = await run_tool(tool, args.trajectories, args.calls, f"{name} {r}")
            failures += failed
            rates[name].append(len(lat) / elapsed)
    await RetrievalClient.close_all()
    return {"rates": rates, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gc_freeze", action="store_true", help="the tool's gc_freeze key (for every variant)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    result = against_stub(measure, args)
    result["micro_us"] = micro_costs()
    medians = {name: statistics.median(r) for name, r in result["rates"].items()}
    on = medians["every feature on"]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# tool feature cost — {when} — {cpu_model()}, {args.trajectories} trajectories x {args.calls} calls, "
          f"median of {args.rounds} rounds, gc_freeze {args.gc_freeze}")  # fmt: skip
    print(f"{'variant':40s} {'calls/s':>8s} {'us/call':>8s} {'saves us/call':>14s}")
    for name, rate in medians.items():
        saves = 1e6 / on - 1e6 / rate
        print(f"{name:40s} {rate:8.0f} {1e6 / rate:8.1f} {saves:14.1f}")
    fresh = result["bare_fresh_process"]
    print(f"{'bare aiohttp client, fresh process':40s} {fresh:8.0f} {1e6 / fresh:8.1f}")
    print(f"tool (every feature on) / bare in a fresh process = {on / fresh:.2f}; failed calls: {result['failures']}")
    print("pure-Python steps of one call, timed alone (us):")
    for name, us in result["micro_us"].items():
        print(f"  {name:45s} {us:6.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
