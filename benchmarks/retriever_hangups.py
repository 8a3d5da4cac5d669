"""Clients hanging up on the retriever, one at a time, as in issue 25: does the server keep answering?

    python benchmarks/retriever_hangups.py                      # this checkout's server
    python benchmarks/retriever_hangups.py --root OTHER_CHECKOUT --mode close

Starts the embedded-default server (60 passages) of ``--root`` on 127.0.0.1, then sends ``--requests`` valid
``POST /retrieve`` requests one at a time and hangs up on each before reading the answer: ``expect`` sends
``Expect: 100-continue``, waits for the interim ``100 Continue``, sends the body and closes; ``close`` sends the whole
request and closes 0-20 ms later. After each, ``/health`` must answer within 3 s. Prints after how many hang-ups the
server stopped answering (or that it never did) and whether SIGTERM ended it within 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def start(root: Path, log: Path) -> tuple[subprocess.Popen, str, int]:
    env = {**os.environ, "VERL_SEARCH_CACHE": str(Path(tempfile.gettempdir()) / "verl-search-hangups-cache")}
    script = root / "local_dense_retriever" / "retrieval_server.py"
    out = open(log, "w")  # noqa: SIM115 (the server's output for its life)
    proc = subprocess.Popen([sys.executable, str(script), "--toy_passages", "60", "--port", "0", "--num_threads", "1"],
                            stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if m := re.search(r"serving on http://127\.0\.0\.1:(\d+)", log.read_text()):
            url = f"http://127.0.0.1:{m.group(1)}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return proc, url, int(m.group(1))
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server never became ready; log: {log}")


def hang_up(port: int, body: bytes, mode: str, rng: random.Random) -> None:
    head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if mode == "expect":
            sock.sendall((head + "Expect: 100-continue\r\n\r\n").encode())
            sock.recv(100)
            sock.sendall(body)
        else:
            sock.sendall((head + "\r\n").encode() + body)
            time.sleep(rng.uniform(0, 0.02))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="checkout whose server runs")
    p.add_argument("--mode", choices=["expect", "close"], default="expect")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, url, port = start(args.root, log)
    body = json.dumps({"queries": ["who wrote the novel"]}).encode()
    try:
        for i in range(1, args.requests + 1):
            hang_up(port, body, args.mode, rng)
            try:
                httpx.get(f"{url}/health", timeout=3)
            except httpx.TransportError:
                print(f"{args.mode}: the server stopped answering after {i} hang-ups")
                break
        else:
            print(f"{args.mode}: still answering after {args.requests} hang-ups")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
            print(f"SIGTERM: exit {proc.returncode} after {time.monotonic() - started:.1f} s")
        except subprocess.TimeoutExpired:
            print("SIGTERM: ignored for 10 s (killed)")
    finally:
        if proc.poll() is None:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
