"""The bare client of benchmarks/tool_overhead.py: one shared aiohttp session posting single-query /retrieve calls.

It imports aiohttp only, so that run as a script it is the leanest honest client: a fresh interpreter that never
imported verl (``python benchmarks/bare_client.py URL TRAJECTORIES CALLS ROUNDS`` prints the median calls/s).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiohttp


async def run_bare(url: str, trajectories: int, calls: int, tag: str) -> tuple[float, list[float]]:
    """``trajectories`` concurrent trajectories of ``calls`` sequential calls: (elapsed seconds, per-call latencies)."""
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


def main(argv: list[str]) -> None:
    url, trajectories, calls, rounds = argv[0], *map(int, argv[1:4])
    rates = []
    for r in range(rounds):
        elapsed, latencies = asyncio.run(run_bare(url, trajectories, calls, f"fresh{r}"))
        rates.append(len(latencies) / elapsed)
    print(statistics.median(rates))


if __name__ == "__main__":
    main(sys.argv[1:])
