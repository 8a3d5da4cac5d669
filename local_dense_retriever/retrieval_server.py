"""CLI of the retrieval service: the published Search-R1 command line plus our flags (derived from ServerConfig).

    python local_dense_retriever/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 [--faiss_gpu]

With no arguments it serves the embedded default (toy corpus + bundled all-MiniLM-L6-v2, built once and cached).
Batching is on by default; ``--no_batching`` is the per-request reference mode.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from pathlib import Path

# OpenMP workers that spin while idle stall torch for ~0.5 s per call when the cores are shared (client, tokenizer,
# other processes); sleeping workers cost nothing measurable. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import ValidationError  # noqa: E402

from local_dense_retriever.config import ServerConfig  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """One flag per ServerConfig field (same name, help = its description); bools get --x / --no_x."""
    p = argparse.ArgumentParser(
        prog="retrieval_server.py",
        description="Search-R1 compatible retrieval service (POST /retrieve) with dynamic batching.",
    )
    for name, field in ServerConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description} (default: {default})"
        ann = field.annotation
        if ann is bool:
            p.add_argument(f"--{name}", dest=name, action="store_const", const=True, default=None, help=help_text)
            p.add_argument(f"--no_{name}", dest=name, action="store_const", const=False, help=f"turn off --{name}")
            continue
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) is typing.Literal:
            p.add_argument(f"--{name}", choices=list(typing.get_args(ann)), default=None, help=help_text)
        elif ann is Path or Path in args:
            p.add_argument(f"--{name}", type=Path, default=None, help=help_text)
        else:
            p.add_argument(f"--{name}", type=ann, default=None, help=help_text)
    p.add_argument("--log_level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def config_from_args(argv: list[str] | None = None) -> tuple[ServerConfig, str]:
    """Parse ``argv`` into a validated ServerConfig (raises ValidationError) and the log level."""
    args = vars(build_parser().parse_args(argv))
    log_level = args.pop("log_level")
    return ServerConfig(**{k: v for k, v in args.items() if v is not None}), log_level


def main(argv: list[str] | None = None) -> int:
    try:
        config, log_level = config_from_args(argv)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "arguments"
        print(f"retrieval_server: error: {where}: {first['msg']}", file=sys.stderr)
        return 2
    if config.num_threads:  # every OpenMP thread (torch and faiss, any worker thread) reads this at first use
        os.environ["OMP_NUM_THREADS"] = str(config.num_threads)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its CPU-feature probing is noise
    import uvicorn

    from local_dense_retriever.app import create_app
    from local_dense_retriever.engine import load_engine

    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failed(error: BaseException) -> None:
        failures.append(error)
        if server is not None:
            server.should_exit = True

    app = create_app(config, loader=lambda: load_engine(config), on_load_failed=on_load_failed)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level.lower(), access_log=False)
    )
    logging.getLogger(__name__).info(
        "serving on http://%s:%d (batching=%s); /health turns 200 once loaded",
        config.host,
        config.port,
        config.batching,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled after a clean shutdown
        pass
    if failures:
        print(f"retrieval_server: error: {failures[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
