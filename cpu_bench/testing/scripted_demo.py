"""``make demo-scripted``: the whole Search-R1 pipeline on a CPU, end to end, with a SCRIPTED policy standing in for
the LLM (``python -m cpu_bench.testing.scripted_demo``; ``python -m cpu_bench.testing.scripted_demo`` still runs it).

Steps: build the embedded toy corpus and its MiniLM index (cached), start the real retriever on 127.0.0.1, preprocess
the toy QA set with ``data_preprocess/prompt.yaml``, roll the questions out through verl's real ``AgentLoopWorker``
(``tool_agent`` + ``SearchTool``, and the native ``search_r1_agent``), score with our reward, print one trajectory
and a summary. No language model runs: the policy searches the question, and if the passages do not contain the
gold answer it searches once more with the first sentence of the passage about the question's entity (the second
hop); its "answer" is the gold answer when retrieval surfaced it. EM here measures the pipeline, not a model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from local_dense_retriever.config import default_cache_dir
from verl_search.resources import AGENT_LOOP_YAML, SEARCH_TOOL_YAML, shipped_file

BANNER = "SCRIPTED POLICY — no language model runs in this demo (see cpu_bench/testing/scripted_demo.py)"


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_retriever(port: int, toy_passages: int, cache_dir: Path, log_path: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "local_dense_retriever.retrieval_server",
        "--port",
        str(port),
        "--toy_passages",
        str(toy_passages),
        "--cache_dir",
        str(cache_dir),
    ]
    log("starting the retriever: " + " ".join(cmd[1:]))
    out = open(log_path, "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    from cpu_bench.background_server import wait_until_healthy

    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", proc, timeout=600, what="retriever")
    except RuntimeError as e:
        raise SystemExit(f"{e}; see {log_path}") from e
    return proc


def preprocess(qa_path: Path, out_dir: Path, template: str) -> list[dict]:
    """verl rows for the questions of ``qa_path`` through the project's preprocessing (what
    ``preprocess_searchR1_dataset.py --input_jsonl QA --data_source toy --splits test --template T`` does)."""
    import pandas as pd

    from verl_search.data.pipeline import PreprocessConfig, run_preprocess
    from verl_search.resources import PROMPT_YAML, shipped_file

    config = PreprocessConfig(
        template_file=shipped_file(PROMPT_YAML),
        template=template,
        input_jsonl=qa_path,
        data_source="toy",
        splits=("test",),
        local_dir=out_dir,
    )
    for _ in run_preprocess(config, progress=False):
        pass
    return pd.read_parquet(out_dir / "test.parquet").to_dict("records")


def follow_up_query(question: str, passages: str) -> str | None:
    """The first sentence of the passage about the question's entity (its title occurs in the question), else of
    the top passage: it names the bridge entity of a two-hop question."""
    docs = re.findall(r'Doc \d+\(Title: "?([^")]*)"?\) (.*)', passages)
    if not docs:
        return None
    title, text = next(((t, x) for t, x in docs if t and t in question), docs[0])
    return text.split(". ")[0]


def two_hop_policy(gold: dict[str, list[str]], native: bool):
    """Search the question; if the gold answer is not in the results, search once more with
    :func:`follow_up_query`; then answer what the oracle reader finds in everything retrieved."""
    from cpu_bench.testing.scripted_policy import UNKNOWN, OracleReader, question_of, retrieved_blocks, search_turn

    reader = OracleReader(gold)

    def policy(inp: Any) -> str:
        question = question_of(inp.conversation)
        retrieved = retrieved_blocks(inp.conversation, "information" if native else "tool_response")
        answer = reader(question, "\n".join(retrieved))
        if answer != UNKNOWN or len(retrieved) >= 2:
            return f"<think> I have what I need. </think>\n<answer> {answer} </answer>"
        query = (follow_up_query(question, retrieved[-1]) if retrieved else None) or question
        return search_turn(query, native=native, thought="I need to search.")

    return policy


def render(trajectory: Any, tokenizer: Any) -> str:
    """The response split into model-written spans and tool spans (response_mask 0: not trained on)."""
    parts, ids, mask = [], trajectory.response_ids, trajectory.response_mask
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False)
            label = "MODEL (trained)" if mask[start] else "TOOL/ENV (mask 0, not trained)"
            parts.append(f"--- {label} ---\n{text.strip()}")
            start = i
    return "\n".join(parts)


async def measure_retriever(url: str, questions: list[str], clients: int = 32, seconds: float = 3.0) -> float:
    import aiohttp

    done = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def worker(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < stop:
                payload = {"queries": [questions[i % len(questions)]], "topk": 3, "return_scores": False}
                async with session.post(url + "/retrieve", json=payload) as resp:
                    resp.raise_for_status()
                    await resp.read()
                done += 1
                i += clients

        start = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        return done / (time.monotonic() - start)


def retrieval_recall(url: str, qa: list[dict], topk: int = 3) -> dict[int, float]:
    hits: dict[int, list[bool]] = {1: [], 2: []}
    for start in range(0, len(qa), 32):
        chunk = qa[start : start + 32]
        body = json.dumps({"queries": [q["question"] for q in chunk], "topk": topk}).encode()
        req = urllib.request.Request(url + "/retrieve", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            result = json.loads(resp.read())["result"]
        for q, docs in zip(chunk, result, strict=True):
            ids = {str(d["id"]) for d in docs}
            support = set(map(str, q["metadata"]["supporting_ids"]))
            hits[q["metadata"]["hops"]].append(bool(ids & support) if q["metadata"]["hops"] == 2 else support <= ids)
    return {h: sum(v) / len(v) for h, v in hits.items() if v}


async def rollout(rows: list[dict], agent: str, tool_yaml: Path, gold: dict, max_turns: int) -> Any:
    from cpu_bench.testing.scripted_rollout import run_rows
    from verl_search.reward import compute_score

    return await run_rows(
        rows,
        policy=two_hop_policy(gold, native=agent == "search_r1_agent"),
        agent_name=agent,
        tool_config_path=tool_yaml,
        agent_loop_config_path=shipped_file(AGENT_LOOP_YAML) if agent == "search_r1_agent" else None,
        max_turns=max_turns,
        compute_score=compute_score,
        # the demo's tokenizer is trained on a few KB of text, so passages cost ~2x the tokens Qwen's would
        response_length=8192,
        max_tool_response_length=6000,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--questions", type=int, default=64, help="questions rolled out per agent loop")
    parser.add_argument("--toy_passages", type=int, default=2000, help="size of the generated corpus")
    parser.add_argument("--max_turns", type=int, default=4)
    parser.add_argument("--cache_dir", default=str(default_cache_dir()), help="the machine-wide cache")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    print(BANNER)
    cache_dir = Path(args.cache_dir).expanduser()
    work = Path(tempfile.mkdtemp(prefix="verl_search_demo_"))
    from cpu_bench.background_server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_retriever(port, args.toy_passages, cache_dir, work / "retriever.log")
    try:
        return asyncio.run(run_demo(args, url, cache_dir, work, t0))
    finally:
        server.terminate()
        server.wait(timeout=30)


async def run_demo(args: argparse.Namespace, url: str, cache_dir: Path, work: Path, t0: float) -> int:
    from transformers import AutoTokenizer

    from cpu_bench.train.local_tokenizer import ensure_tokenizer_dir
    from verl_search import search_stats
    from verl_search.launch.tool_yaml import write_tool_config

    log(f"retriever ready at {url} ({time.monotonic() - t0:.0f}s)")
    qa_path = cache_dir / f"toy-{args.toy_passages}" / "qa.jsonl"
    qa = [json.loads(line) for line in qa_path.read_text().splitlines()]
    single = [q for q in qa if q["metadata"]["hops"] == 1][: args.questions // 2]
    double = [q for q in qa if q["metadata"]["hops"] == 2][: args.questions - len(single)]
    subset = single + double
    (work / "qa_subset.jsonl").write_text("".join(json.dumps(q) + "\n" for q in subset))
    gold = {q["question"]: q["golden_answers"] for q in subset}
    hops = {q["question"]: q["metadata"]["hops"] for q in subset}

    tool_yaml = write_tool_config(shipped_file(SEARCH_TOOL_YAML), work / "search_tool_config.yaml", url + "/retrieve")

    results = {}
    for agent, template in (("tool_agent", "tool_call"), ("search_r1_agent", "search_r1")):
        rows = preprocess(work / "qa_subset.jsonl", work / template, template)
        log(f"preprocessed {len(rows)} questions with template '{template}' -> {work / template / 'test.parquet'}")
        started = time.monotonic()
        results[agent] = (rows, await rollout(rows, agent, tool_yaml, gold, args.max_turns))
        log(
            f"{agent}: rolled out {len(rows)} trajectories through verl's AgentLoopWorker "
            f"in {time.monotonic() - started:.1f}s"
        )

    tokenizer = AutoTokenizer.from_pretrained(ensure_tokenizer_dir())
    rows, result = results["tool_agent"]
    two_hop = [i for i, r in enumerate(rows) if hops[r["extra_info"]["question"]] == 2]
    solved = [i for i in two_hop if result.trajectories[i].score["em"] == 1.0]
    example = (solved or two_hop or [0])[0]
    print("\n================ one full trajectory (tool_agent + SearchTool) ================")
    print(
        f"question: {rows[example]['extra_info']['question']}   gold: {gold[rows[example]['extra_info']['question']]}"
    )
    print(render(result.trajectories[example], tokenizer))
    print(f"reward: {result.trajectories[example].score}")

    recall = retrieval_recall(url, subset)
    qps = await measure_retriever(url, [q["question"] for q in qa[:512]])
    print("\n================ summary (" + BANNER.split(" —")[0] + ") ================")
    print(f"{'agent loop':18s} {'hops':>4s} {'n':>4s} {'EM':>6s} {'searches':>9s} {'answered':>9s}")
    for agent, (rows, result) in results.items():
        for hop in (1, 2):
            scores = [
                t.score
                for r, t in zip(rows, result.trajectories, strict=True)
                if hops[r["extra_info"]["question"]] == hop
            ]
            if not scores:
                continue
            em = sum(s["em"] for s in scores) / len(scores)
            searches = sum(s["num_searches"] for s in scores) / len(scores)
            answered = sum(s["answered"] for s in scores) / len(scores)
            print(f"{agent:18s} {hop:4d} {len(scores):4d} {em:6.2f} {searches:9.2f} {answered:9.2f}")
    print(
        f"retrieval recall@3 (supporting passage in top 3): single-hop {recall.get(1, 0):.2f}, "
        f"two-hop first hop {recall.get(2, 0):.2f}"
    )
    print(f"retriever throughput (32 concurrent single-query clients, 3 s): {qps:.0f} queries/s")
    stats = search_stats()
    print(
        f"search tool counters: {stats['calls']} calls, {stats['failed_calls']} failed, "
        f"{stats['cache_hits']} cache hits, latency p50 {1000 * stats['latency_p50_s']:.1f} ms, "
        f"p99 {1000 * stats['latency_p99_s']:.1f} ms"
    )
    from verl_search.tool.client import RetrievalClient

    await RetrievalClient.close_all()
    print(f"demo finished in {time.monotonic() - t0:.0f}s; files in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
