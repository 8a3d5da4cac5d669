"""Tool overhead: SearchTool driven like verl's ToolAgentLoop vs a bare shared-session aiohttp client, same stub.

    python benchmarks/tool_overhead.py [--trajectories 512] [--calls 4] [--rounds 7] [--gc_freeze]

An instant stub retriever (made-up passages, no model, no index) runs in a subprocess on 127.0.0.1, on its own core.
Each trajectory makes ``--calls`` sequential calls; all trajectories run concurrently. "SearchTool" is driven as
verl's ``ToolAgentLoop`` drives it (create, execute, release per call) with every safety feature on and its limits
out of the way (no rate limit, a worker per trajectory; deadline, retries, cache and coalescing active, every query
new so the cache never hits). Rounds alternate bare/tool; the median round and the median of the per-round ratios
are reported. The same bare client also runs alone in a fresh interpreter that never imported verl: the leanest
honest client (a rollout worker always has verl imported). Last, a GRPO-like load (5 samples per prompt, the first
query shared, samples starting 300 ms apart) counts the HTTP requests the stub received with the cache on and off.

The stub and the bare client live in this file and import aiohttp only (``--stub PORT`` and ``--bare URL T C R``
run them); the tool is imported only where it is measured.
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
import urllib.request
from datetime import date
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent


def serve_stub(port: int) -> None:
    """The instant stub: ``POST /retrieve`` answers each query with ``topk`` passages made up from it, ``GET /stats``
    counts the requests received, ``GET /health`` says ok."""
    from aiohttp import web

    requests = 0

    async def retrieve(request: web.Request) -> web.Response:
        nonlocal requests
        requests += 1
        body = await request.json()
        topk = int(body.get("topk") or 3)
        result = []
        for q in body["queries"]:
            docs = [{"id": f"{q}#{i}", "contents": f'"{q}"\nPassage {i + 1} about {q}.'} for i in range(topk)]
            result.append([{"document": d, "score": 1.0 / (i + 1)} for i, d in enumerate(docs)]
                          if body.get("return_scores") else docs)  # fmt: skip
        return web.json_response({"result": result})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"requests": requests})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


async def run_bare(url: str, trajectories: int, calls: int, tag: str) -> tuple[float, list[float]]:
    """``trajectories`` concurrent trajectories of ``calls`` sequential calls through one shared aiohttp session:
    (elapsed seconds, per-call latencies)."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=trajectories)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def trajectory(t: int) -> None:
            for c in range(calls):
                start = time.perf_counter()
                payload = {"queries": [f"{tag} q{t}-{c}"], "topk": 3, "return_scores": False}
                async with session.post(url + "/retrieve", json=payload) as resp:
                    body = await resp.json()
                assert len(body["result"]) == 1
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(trajectory(t) for t in range(trajectories)))
        return time.perf_counter() - start, latencies


def bare_alone(url: str, trajectories: int, calls: int, rounds: int) -> float:
    """Median calls/s of the bare client over ``rounds`` rounds (run by ``--bare`` in a fresh interpreter)."""
    rates = []
    for r in range(rounds):
        elapsed, latencies = asyncio.run(run_bare(url, trajectories, calls, f"fresh{r}"))
        rates.append(len(latencies) / elapsed)
    return statistics.median(rates)


def bare_in_fresh_process(url: str, trajectories: int, calls: int, rounds: int) -> float:
    """The bare client in a new interpreter that has not imported verl: what a client outside a rollout worker gets
    (no import-time objects for the garbage collector to walk)."""
    argv = [sys.executable, __file__, "--bare", url, str(trajectories), str(calls), str(rounds)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip())


def start_stub() -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--stub", str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the stub server did not start within 30 s")


def stub_requests(url: str) -> int:
    return json.loads(urllib.request.urlopen(url + "/stats", timeout=5).read())["requests"]


async def run_tool(tool, trajectories: int, calls: int, tag: str, query_of=None, start_delay=None):
    """(elapsed seconds, per-call latencies, failed calls) of ``tool`` under the same load as ``run_bare``."""
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
            _, _, metrics = await tool.execute(instance_id, {"query_list": [query]}, agent_data=None)
            await tool.release(instance_id)
            failures += not metrics["ok"]
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(trajectory(t) for t in range(trajectories)))
    return time.perf_counter() - start, latencies, failures


def summary(name: str, elapsed: float, latencies: list[float]) -> dict:
    lat = sorted(latencies)
    return {"name": name, "calls": len(lat), "calls_per_s": len(lat) / elapsed, "p50_ms": 1000 * percentile(lat, 50),
            "p99_ms": 1000 * percentile(lat, 99)}  # fmt: skip


async def measure(args: argparse.Namespace, url: str) -> dict:
    sys.path.insert(0, str(REPO))
    from verl_search import SearchTool
    from verl_search.tool.client import RetrievalClient

    fast = {"type": "native", "retrieval_service_url": url, "rate_limit": None, "gc_freeze": args.gc_freeze,
            "num_workers": max(args.trajectories, 1), "stats_log_interval": 0}  # fmt: skip
    tool = SearchTool(dict(fast))
    bare_rounds, tool_rounds = [], []
    failures = 0
    for r in range(args.rounds):
        elapsed, lat = await run_bare(url, args.trajectories, args.calls, f"bare{r}")
        bare_rounds.append(summary("bare aiohttp client", elapsed, lat))
        elapsed, lat, failed = await run_tool(tool, args.trajectories, args.calls, f"tool{r}")
        failures += failed
        tool_rounds.append(summary("SearchTool (create/execute/release)", elapsed, lat))

    # GRPO-like: prompts x 5 samples; every sample's first query is the prompt's question
    grpo = {}
    samples = 5
    prompts = max(1, args.trajectories // samples)
    for label, cache_size in (("cache on", 100_000), ("cache off, coalescing only", 0)):
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
        grpo[label] = {"calls": len(lat), "http_requests": stub_requests(url) - before,
                       "calls_per_s": len(lat) / elapsed}  # fmt: skip
    await RetrievalClient.close_all()
    by_rate = lambda s: s["calls_per_s"]  # noqa: E731
    return {
        "bare": sorted(bare_rounds, key=by_rate)[len(bare_rounds) // 2],
        "tool": sorted(tool_rounds, key=by_rate)[len(tool_rounds) // 2],
        # rounds alternate bare/tool, so each round's pair shares the machine's state: the median paired ratio is
        # steadier than the ratio of medians on a shared 2-core machine
        "ratio": statistics.median(
            t["calls_per_s"] / b["calls_per_s"] for b, t in zip(bare_rounds, tool_rounds, strict=True)
        ),
        "rounds": {"bare": bare_rounds, "tool": tool_rounds},
        "grpo": grpo,
        "failures": failures,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--stub":
        serve_stub(int(sys.argv[2]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--bare":
        url, trajectories, calls, rounds = sys.argv[2], *map(int, sys.argv[3:6])
        print(bare_alone(url, trajectories, calls, rounds))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--gc_freeze",
        action="store_true",
        help="build the tool with gc_freeze: this process's start-up objects are frozen (for the bare client too)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    proc, url = start_stub()
    try:
        result = asyncio.run(measure(args, url))
        result["bare_fresh_process"] = bare_in_fresh_process(url, args.trajectories, args.calls, args.rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    from retriever_load import cpu_name  # (this process only: the stub and the bare client import aiohttp alone)

    print(f"# tool overhead — {date.today()} — {platform.node()}, {cpu_name()}, {args.trajectories} trajectories x "
          f"{args.calls} calls, median of {args.rounds} rounds")  # fmt: skip
    print(f"{'client':44s} {'calls/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for row in (result["bare"], result["tool"]):
        print(f"{row['name']:44s} {row['calls_per_s']:9.0f} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f}")
    fresh = result["bare_fresh_process"]
    print(f"{'bare aiohttp client, fresh process (no verl)':44s} {fresh:9.0f}")
    print(f"SearchTool / bare (median of per-round ratios) = {result['ratio']:.2f}; failed calls: {result['failures']}")
    print(f"SearchTool / bare in a fresh process = {result['tool']['calls_per_s'] / fresh:.2f} (that process has no "
          f"verl objects for the garbage collector to walk; --gc_freeze freezes them here)")  # fmt: skip
    for label, g in result["grpo"].items():
        saved = g["calls"] - g["http_requests"]
        print(f"GRPO-like ({label}): {g['calls']} calls -> {g['http_requests']} HTTP requests ({saved} served by "
              f"cache/coalescing; without either: {g['calls']})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
