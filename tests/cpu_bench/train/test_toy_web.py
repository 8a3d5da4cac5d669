"""The toy world as a web search API (``make train --search web|web-replay``): it answers in Serper's shape, the
retriever's web backend rebuilds each passage from it, and a replay without a recording is refused before any stage."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cpu_bench.testing.stub_retriever import StubServer
from cpu_bench.train.__main__ import _parser, config_from_args, main
from cpu_bench.train.toy_web import ToyWeb

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.', "url": "https://en.wikipedia.org/wiki/Paris"},
    {"id": "1", "contents": '"Lyon"\nLyon is a city on the Rhone.', "url": "https://en.wikipedia.org/wiki/Lyon"},
]


def _search(url: str, body: dict, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/search", json.dumps(body).encode(), {"Content-Type": "application/json", "X-API-KEY": key}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_the_toy_web_answers_in_serpers_shape_and_counts_its_calls():
    with StubServer(CORPUS) as retriever, ToyWeb(f"{retriever.url}/retrieve") as web:
        status, body = _search(web.url, {"q": "capital of france", "num": 1}, web.key)
        assert status == 200 and web.calls == 1
        assert body["organic"][0]["title"] == "Paris" and body["organic"][0]["position"] == 1
        assert body["organic"][0]["snippet"] == "Paris is the capital of France."
        assert _search(web.url, {"q": "capital of france"}, "wrong key")[0] == 403  # as Serper refuses a bad key
        assert _search(web.url, {"num": 2}, web.key)[0] == 400
        assert web.calls == 1  # refused requests are not billed


def test_the_web_backend_rebuilds_each_passage_from_the_toy_web(tmp_path, monkeypatch):
    from local_dense_retriever.config import ServerConfig
    from local_dense_retriever.web.backend import WebSearch

    with StubServer(CORPUS) as retriever, ToyWeb(f"{retriever.url}/retrieve") as web:
        monkeypatch.setenv("SERPER_API_KEY", web.key)
        config = ServerConfig(backend="web", web_base_url=f"{web.url}/search", web_cache_path=tmp_path / "c.sqlite3")
        backend = WebSearch(config)
        try:
            [hits] = backend.search(["capital of france"], 1)
        finally:
            backend.close()
    document, _ = hits[0]
    assert document["contents"] == CORPUS[0]["contents"] and document["url"] == CORPUS[0]["url"]


def test_the_search_flags_reach_the_settings(tmp_path):
    args = _parser().parse_args(["--quick", "--search", "web-replay", "--web_cache", str(tmp_path / "w.sqlite3")])
    config = config_from_args(args)
    assert config.search_backend == "web-replay" and config.web_cache == tmp_path / "w.sqlite3"


def test_a_replay_without_a_recording_is_one_error_naming_how_to_record(tmp_path, capsys):
    assert main(["--quick", "--search", "web-replay", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "no recorded web cache" in err and "--search web" in err
    assert not (tmp_path / "run" / "data").exists()  # nothing ran


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path / "cache"))
