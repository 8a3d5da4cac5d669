"""CLI of the retrieval service: the published Search-R1 command line plus our flags (derived from ServerConfig).

    python local_dense_retriever/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 [--faiss_gpu]

With no arguments it serves the embedded default (toy corpus + bundled all-MiniLM-L6-v2, built once and cached).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import typing
from pathlib import Path

# OpenMP workers that spin while idle stall torch when the cores are shared; set before torch is imported
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel, ValidationError  # noqa: E402

from local_dense_retriever.config import ServerConfig, refuse_removed_flags  # noqa: E402

#: other projects' spellings of our flags (their launch scripts must keep working): flag → ServerConfig field
ALIASES = {"pooling_method": "pooling"}


def _spellings(name: str) -> list[str]:
    """``--save_address_to`` and ``--save-address-to`` (ASearcher's spelling) both work, for every flag."""
    return [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])


def add_model_flags(p: argparse.ArgumentParser, model: type[BaseModel], aliases: dict[str, str] | None = None) -> None:
    """One flag per field of ``model`` (help: its description; bools get --no_x too), plus ``aliases``."""
    extra: dict[str, list[str]] = {}
    for alias, target in (aliases or {}).items():
        extra.setdefault(target, []).extend(_spellings(alias))
    own_first = sorted(model.model_fields.items(), key=lambda item: item[0] not in model.__annotations__)
    for name, field in own_first:  # a base model's fields (the web backend's) after the model's own
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description} (default: {default})".replace("%", "%%")  # argparse %-formats help
        flags = _spellings(name) + extra.get(name, [])
        ann = field.annotation
        if ann is bool:
            p.add_argument(*flags, dest=name, action="store_const", const=True, default=None, help=help_text)
            p.add_argument(*_spellings(f"no_{name}"), dest=name, action="store_const", const=False,
                           help=f"turn off --{name}")  # fmt: skip
            continue
        args = [a for a in typing.get_args(ann) if a is not type(None)]  # X | None -> X
        if typing.get_origin(ann) is typing.Literal:
            p.add_argument(*flags, dest=name, choices=list(typing.get_args(ann)), default=None, help=help_text)
        else:
            p.add_argument(*flags, dest=name, type=args[0] if args else ann, default=None, help=help_text)


def add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log_level", "--log-level", dest="log_level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """One flag per ServerConfig field (same name, help = its description); bools get --x / --no_x."""
    p = argparse.ArgumentParser(
        prog="retrieval_server.py",
        description="Search-R1 compatible retrieval service (POST /retrieve, POST /access) with dynamic batching.",
    )
    add_model_flags(p, ServerConfig, ALIASES)
    add_log_level(p)
    return p


def first_error(e: ValidationError) -> str:
    """``field: message`` of the first problem pydantic found (the one line a CLI prints)."""
    first = e.errors()[0]
    return f"{'.'.join(str(x) for x in first['loc']) or 'arguments'}: {first['msg']}"


def config_from_args(argv: list[str] | None = None) -> tuple[ServerConfig, str]:
    """Parse ``argv`` into a validated ServerConfig (raises ValidationError) and the log level."""
    parser = build_parser()
    refuse_removed_flags(parser, argv)
    args = vars(parser.parse_args(argv))
    log_level = args.pop("log_level")
    return ServerConfig(**{k: v for k, v in args.items() if v is not None}), log_level


def advertised_ip(host: str) -> str:
    """The address clients should use: the bound one, or this machine's (as ASearcher writes it) for 0.0.0.0/::."""
    if host in ("", "0.0.0.0", "::"):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return host


def save_address(folder: Path, host: str, port: int) -> Path:
    """ASearcher/RLinf discovery: ``folder/Host<ip>_IP<port>.txt`` holding ``<ip>:<port>`` (written atomically)."""
    from verl_search.atomic import atomic_path

    ip = advertised_ip(host)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"Host{ip}_IP{port}.txt"
    with atomic_path(target) as tmp:
        tmp.write_text(f"{ip}:{port}")
    return target


def log_substitutions(config: ServerConfig, log: logging.Logger) -> None:
    """One log line per flag that asks for something this server does differently (it starts anyway)."""
    if config.faiss_gpu_id is not None:
        log.warning("--faiss_gpu_id %d: this server uses every visible GPU; choose them with CUDA_VISIBLE_DEVICES "
                    "(GPUS= in run_scripts/launch_retriever.sh)",
                    config.faiss_gpu_id)  # fmt: skip
    if config.save_address_to is not None and config.host == "127.0.0.1":
        log.warning("--save-address-to: the server listens on 127.0.0.1 only (add --host 0.0.0.0 for other machines)")


def listening_socket(host: str, port: int) -> socket.socket:
    """The bound socket with TCP_NODELAY, which accepted connections inherit (uvicorn sets none on a given one)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    from local_dense_retriever.flag_scope import FlagScopeError, check_flag_scope

    try:
        config, log_level = config_from_args(argv)
        ignored = check_flag_scope(config)
    except ValidationError as e:
        print(f"retrieval_server: error: {first_error(e)}", file=sys.stderr)
        return 2
    except FlagScopeError as e:
        print(f"retrieval_server: error: {e}", file=sys.stderr)
        return 2
    if config.num_threads:  # every OpenMP thread (torch and faiss, any worker thread) reads this at first use
        os.environ["OMP_NUM_THREADS"] = str(config.num_threads)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # its CPU-feature probing is noise
    log = logging.getLogger(__name__)
    import uvicorn

    from local_dense_retriever.app import create_app
    from local_dense_retriever.engine import load_engine
    from local_dense_retriever.http_protocol import json_400_protocol

    for line in ignored:
        log.warning("%s", line)
    log_substitutions(config, log)
    try:
        sock = listening_socket(config.host, config.port)
    except OSError as e:
        print(f"retrieval_server: error: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failed(error: BaseException) -> None:
        failures.append(error)
        if server is not None:
            server.should_exit = True

    def on_ready() -> None:
        if config.save_address_to is not None:
            log.info("wrote the server address to %s", save_address(config.save_address_to, config.host, port))

    app = create_app(config, loader=lambda: load_engine(config), on_load_failed=on_load_failed, on_ready=on_ready)
    watchdog = app.state.service.watchdog

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            watchdog.terminate_requested()  # honoured by the watchdog if the event loop is blocked and cannot
            super().handle_exit(sig, frame)

    server = Server(
        uvicorn.Config(
            app,
            log_level=log_level.lower(),
            access_log=False,
            http=json_400_protocol(config.body_timeout_s),  # JSON 400s; a deadline for request headers too
            proxy_headers=False,  # the service never reads a client's address: no X-Forwarded-* rewriting per request
            timeout_graceful_shutdown=30,
        )
    )
    log.info("serving on http://%s:%d (batching=%s); /health turns 200 once loaded", config.host, port, config.batching)
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the previous handler: a no-op, so a drain exits 0
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if app.state.service.status == "loading":
        abandon_load(log)
    if failures:
        print(f"retrieval_server: error: {failures[0]}", file=sys.stderr)
        return 1
    return 0


def abandon_load(log: logging.Logger) -> typing.NoReturn:
    """Exit 0 now, abandoning the load still running on its thread (download, build, encode, load or pre-scan), which
    Python cannot interrupt and would otherwise wait for. Its writers write temporaries and rename only what is
    complete, so nothing left looks complete; the next run removes the temporaries."""
    log.info("stopped during start-up: the load in progress is abandoned")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
