"""HubSource against a small hub look-alike on 127.0.0.1, driven by the real huggingface_hub client.

The app serves the two routes huggingface_hub uses for dataset repos (tree listing, resolve with HEAD/GET/Range);
it can drop a transfer near its end, as a flaky network does, to show that parts resume instead of restarting.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.artifacts.download import CORPUS, INDEX, download
from local_dense_retriever.artifacts.sources import DownloadError, HubSource

COMMIT = "0" * 40


def _hub_app(repos: dict[str, dict[str, bytes]], log: list[tuple[str, str, str]], drop_once: set[str]) -> FastAPI:
    app = FastAPI()

    @app.get("/api/datasets/{owner}/{name}/tree/{revision}")
    def tree(owner: str, name: str, revision: str) -> Response:
        files = repos.get(f"{owner}/{name}")
        if files is None:
            return JSONResponse(
                {"error": "Repository not found"}, status_code=404, headers={"X-Error-Code": "RepoNotFound"}
            )
        items = [
            {"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest()} for p, d in files.items()
        ]
        return JSONResponse(items)

    @app.api_route("/datasets/{owner}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
    def resolve(owner: str, name: str, revision: str, path: str, request: Request) -> Response:
        data = repos[f"{owner}/{name}"][path]
        log.append((request.method, path, request.headers.get("range", "")))
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        if request.method == "HEAD":
            return Response(headers={**headers, "Content-Length": str(len(data))})
        start = int(request.headers.get("range", "bytes=0-")[len("bytes=") :].split("-")[0])
        body = data[start:]

        def stream() -> Iterator[bytes]:
            for i in range(0, len(body), 1 << 20):
                if path in drop_once and i >= len(body) - (1 << 20):
                    drop_once.discard(path)
                    raise ConnectionResetError("connection dropped")  # the client sees a short body
                yield body[i : i + (1 << 20)]

        status = 206 if start else 200
        return StreamingResponse(stream(), status_code=status, headers={**headers, "Content-Length": str(len(body))})

    return app


@pytest.fixture
def hub() -> Iterator[dict]:
    rnd = random.Random(1)
    repos = {
        # part_ab is larger than huggingface_hub's 10 MiB read chunk, so a dropped transfer has something to keep
        INDEX.repo_id: {"part_aa": rnd.randbytes(200_000), "part_ab": rnd.randbytes(12_500_000)},
        CORPUS.repo_id: {"wiki-18.jsonl.gz": b"not needed here"},
    }
    state = {"repos": repos, "log": [], "drop_once": set()}
    with BackgroundServer(_hub_app(repos, state["log"], state["drop_once"])) as server:
        state["url"] = server.url
        yield state


def test_index_is_downloaded_through_huggingface_hub_and_joined(tmp_path: Path, hub: dict) -> None:
    save = tmp_path / "save"
    download(save, [INDEX], HubSource(hub["url"]), progress=False)
    parts = hub["repos"][INDEX.repo_id]
    assert (save / "e5_Flat.index").read_bytes() == parts["part_aa"] + parts["part_ab"]
    assert {p for m, p, _ in hub["log"] if m == "GET"} == {"part_aa", "part_ab"}


def test_a_dropped_transfer_resumes_from_where_it_stopped(tmp_path: Path, hub: dict) -> None:
    hub["drop_once"].add("part_ab")
    save = tmp_path / "save"
    download(save, [INDEX], HubSource(hub["url"]), progress=False)
    parts = hub["repos"][INDEX.repo_id]
    assert (save / "e5_Flat.index").read_bytes() == parts["part_aa"] + parts["part_ab"]
    ranges = [r for m, p, r in hub["log"] if m == "GET" and p == "part_ab"]
    assert ranges[0] == "" and ranges[-1].startswith("bytes=") and ranges[-1] != "bytes=0-", ranges


def test_an_unknown_repo_is_a_clear_error(tmp_path: Path, hub: dict) -> None:
    del hub["repos"][INDEX.repo_id]
    with pytest.raises(DownloadError, match="dataset repo PeterJinGo/wiki-18-e5-index not found on http://127.0.0.1"):
        download(tmp_path / "save", [INDEX], HubSource(hub["url"]), progress=False)
