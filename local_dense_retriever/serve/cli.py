"""``python -m local_dense_retriever.serve``: the retriever as a Ray Serve fleet behind one URL.

    python -m local_dense_retriever.serve --address auto --num_replicas 4 --num_gpus 0.1 \\
        --index_path e5_Flat.index --corpus_path wiki-18.jsonl --retriever_model intfloat/e5-base-v2 --port 8000
    python -m local_dense_retriever.serve --shards 2 ...          # the flat index split over 2 shard deployments
    python -m local_dense_retriever.serve --address auto --stop   # remove the application

Every flag of retrieval_server.py is accepted (the replicas' server settings; --host/--port are the Serve proxy's).
Prints ``RETRIEVER_URL=http://HOST:PORT`` once every replica answers, then stays in the foreground (SIGTERM or Ctrl-C
removes the application) unless --detach leaves the fleet running in the cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see retrieval_server.py)

from pydantic import ValidationError  # noqa: E402

from local_dense_retriever.config import ServerConfig, refuse_removed_flags  # noqa: E402
from local_dense_retriever.retrieval_server import (  # noqa: E402
    ALIASES,
    add_log_level,
    add_model_flags,
    first_error,
    save_address,
)
from local_dense_retriever.serve.errors import ServeSetupError  # noqa: E402
from local_dense_retriever.serve.options import ServeOptions  # noqa: E402

PROG = "python -m local_dense_retriever.serve"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The retrieval service as a Ray Serve fleet behind one URL.")
    fleet = p.add_argument_group("fleet (Ray Serve)")
    add_model_flags(fleet, ServeOptions)
    fleet.add_argument("--stop", action="store_true", help="remove the application from the cluster and exit")
    add_model_flags(p.add_argument_group("server (every replica)"), ServerConfig, ALIASES)
    add_log_level(p)
    return p


def parse(argv: list[str] | None = None) -> tuple[ServerConfig, ServeOptions, bool, str]:
    """(server config, fleet options, --stop, log level); raises ValidationError on bad values."""
    parser = build_parser()
    refuse_removed_flags(parser, argv)
    args = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    log_level, stop = args.pop("log_level"), args.pop("stop")
    fleet = {k: args.pop(k) for k in list(args) if k in ServeOptions.model_fields}
    return ServerConfig(**args), ServeOptions(**fleet), stop, log_level


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(3600):
        pass


def main(argv: list[str] | None = None) -> int:
    from local_dense_retriever.flag_scope import FlagScopeError, check_flag_scope

    try:
        config, options, stop, log_level = parse(argv)
        ignored = check_flag_scope(config)
    except ValidationError as e:
        print(f"{PROG}: error: {first_error(e)}", file=sys.stderr)
        return 2
    except FlagScopeError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for line in ignored:
        logging.getLogger(__name__).warning("%s", line)
    from local_dense_retriever.serve.fleet import connect, start_fleet, stop_fleet

    try:
        if stop:
            connect(options.address)
            stop_fleet(options)
            print(f"removed the Serve application {options.app_name!r}")
            return 0
        url = start_fleet(config, options)
    except ServeSetupError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if config.save_address_to is not None:
        save_address(config.save_address_to, config.host, int(url.rsplit(":", 1)[1]))
    print(f"RETRIEVER_URL={url}", flush=True)
    if options.detach:
        print(f"the fleet keeps running in the cluster; remove it with: {PROG} --address {options.address} --stop")
        return 0
    _wait_for_signal()
    stop_fleet(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
