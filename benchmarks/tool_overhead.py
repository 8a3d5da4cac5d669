"""Tool overhead: SearchTool driven like verl's ToolAgentLoop vs a bare shared-session aiohttp client, same stub.

    python benchmarks/tool_overhead.py [--trajectories 512] [--calls 4] [--rounds 3] [--gc_freeze]

The instant stub runs in a subprocess on 127.0.0.1 (its own core). Each trajectory makes ``--calls`` sequential
calls; all trajectories run concurrently. Rounds alternate bare/tool and the median round is reported. The same bare
client also runs alone in a fresh interpreter that never imported verl: the leanest honest client (a rollout worker
always has verl imported). The GRPO run groups trajectories by prompt (5 samples each, first query shared, samples
starting 300 ms apart) and counts the HTTP requests the stub received with the cache on and off; without either,
every call is one request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from bare_client import run_bare

from verl_search import SearchTool
from verl_search.testing.background_server import free_port, wait_until_healthy
from verl_search.tool.client import RetrievalClient
from verl_search.tool.stats import STATS, percentile


def bare_in_fresh_process(url: str, trajectories: int, calls: int, rounds: int) -> float:
    """Median calls/s of the bare client in a new interpreter that has not imported verl: what a client outside a
    rollout worker gets (no import-time objects for the garbage collector to walk)."""
    argv = [sys.executable, str(Path(__file__).with_name("bare_client.py")), url, str(trajectories), str(calls),
            str(rounds)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip())


def start_stub() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "verl_search.testing.stub_retriever", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, timeout=30, what="stub server")
    except RuntimeError as e:
        raise SystemExit(str(e)) from e
    return proc, url


def against_stub(measure, args: argparse.Namespace) -> dict:
    """``measure(args, url)`` run against a fresh stub, plus the bare client in a fresh process against the same
    stub (``bare_fresh_process``, calls/s); the stub is stopped whatever happens."""
    proc, url = start_stub()
    try:
        result = asyncio.run(measure(args, url))
        result["bare_fresh_process"] = bare_in_fresh_process(url, args.trajectories, args.calls, args.rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return result


def stub_requests(url: str) -> int:
    import urllib.request

    return json.loads(urllib.request.urlopen(url + "/stats", timeout=5).read())["requests"]


async def run_tool(
    tool: SearchTool, trajectories: int, calls: int, tag: str, query_of=None, start_delay=None
) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = 0

    async def trajectory(t: int) -> None:
        nonlocal failures
        if start_delay is not None:
            await asyncio.sleep(start_delay(t))
        for c in range(calls):
            start = time.perf_counter()
            query = query_of(t, c) if query_of else f"{tag} q{t}-{c}"
            instance_id, _ = await tool.create(create_kwargs={})
            response, _, metrics = await tool.execute(instance_id, {"query_list": [query]}, agent_data=None)
            await tool.release(instance_id)
            failures += not metrics["ok"]
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(trajectory(t) for t in range(trajectories)))
    return time.perf_counter() - start, latencies, failures


def summary(name: str, elapsed: float, latencies: list[float]) -> dict:
    lat = sorted(latencies)
    return {
        "name": name,
        "calls": len(lat),
        "calls_per_s": len(lat) / elapsed,
        "p50_ms": 1000 * percentile(lat, 50),
        "p99_ms": 1000 * percentile(lat, 99),
    }


async def main_async(args: argparse.Namespace, url: str) -> dict:
    fast = {
        "type": "native",
        "retrieval_service_url": url,
        "rate_limit": None,
        "gc_freeze": args.gc_freeze,
        "num_workers": max(args.trajectories, 1),
        "stats_log_interval": 0,
    }
    tool = SearchTool(dict(fast))
    bare_rounds, tool_rounds = [], []
    failures = 0
    for r in range(args.rounds):
        elapsed, lat = await run_bare(url, args.trajectories, args.calls, f"bare{r}")
        bare_rounds.append(summary("bare aiohttp client", elapsed, lat))
        elapsed, lat, failed = await run_tool(tool, args.trajectories, args.calls, f"tool{r}")
        failures += failed
        tool_rounds.append(summary("SearchTool (create/execute/release)", elapsed, lat))
    bare = sorted(bare_rounds, key=lambda s: s["calls_per_s"])[len(bare_rounds) // 2]
    tool_med = sorted(tool_rounds, key=lambda s: s["calls_per_s"])[len(tool_rounds) // 2]

    # GRPO-like: prompts x 5 samples; every sample's first query is the prompt's question.
    grpo = {}
    samples = 5
    prompts = max(1, args.trajectories // samples)
    for label, cache_size in (("cache on", 100_000), ("cache off, coalescing only", 0)):
        STATS.reset()
        grpo_tool = SearchTool({**fast, "cache_size": cache_size})
        before = stub_requests(url)

        def query_of(t: int, c: int, label=label) -> str:
            prompt, sample = divmod(t, samples)
            return f"grpo {label} prompt {prompt} question" if c == 0 else f"grpo {label} p{prompt} s{sample} c{c}"

        # samples of one prompt start 300 ms apart, as GRPO's n samples reach their first search at different times
        elapsed, lat, failed = await run_tool(
            grpo_tool, prompts * samples, args.calls, "", query_of, start_delay=lambda t: 0.3 * (t % samples)
        )
        failures += failed
        grpo[label] = {
            "calls": len(lat),
            "http_requests": stub_requests(url) - before,
            "calls_per_s": len(lat) / elapsed,
            "cache_hits": STATS.snapshot()["cache_hits"] + STATS.snapshot()["coalesced"],
        }
    await RetrievalClient.close_all()
    return {
        "bare": bare,
        "tool": tool_med,
        # rounds alternate bare/tool, so each round's pair shares the machine's state: the median paired ratio is
        # steadier than the ratio of medians on a shared 2-core machine
        "ratio": statistics.median(
            t["calls_per_s"] / b["calls_per_s"] for b, t in zip(bare_rounds, tool_rounds, strict=True)
        ),
        "rounds": {"bare": bare_rounds, "tool": tool_rounds},
        "grpo": grpo,
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--gc_freeze",
        action="store_true",
        help="build the tool with gc_freeze: this process's start-up objects are frozen (for the bare client too)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    result = against_stub(main_async, args)
    print(
        f"# tool overhead — {date.today()} — {platform.node()} {platform.processor() or platform.machine()}, "
        f"{args.trajectories} trajectories x {args.calls} calls, median of {args.rounds} rounds"
    )
    print(f"{'client':40s} {'calls/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for row in (result["bare"], result["tool"]):
        print(f"{row['name']:40s} {row['calls_per_s']:9.0f} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f}")
    fresh = result["bare_fresh_process"]
    print(f"{'bare aiohttp client, fresh process (no verl)':40s} {fresh:9.0f}")
    print(f"SearchTool / bare (median of per-round ratios) = {result['ratio']:.2f}; failed calls: {result['failures']}")
    print(f"SearchTool / bare in a fresh process = {result['tool']['calls_per_s'] / fresh:.2f} (that process has no "
          f"verl objects for the garbage collector to walk; --gc_freeze freezes them here)")  # fmt: skip
    for label, g in result["grpo"].items():
        print(
            f"GRPO-like ({label}): {g['calls']} calls -> {g['http_requests']} HTTP requests "
            f"({g['cache_hits']} served by cache/coalescing; without either: {g['calls']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
