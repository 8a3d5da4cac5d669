"""POST /retrieve on the lean path (local_dense_retriever.retrieve) answers exactly as FastAPI's own route does: same
statuses, same bodies, byte for byte, for good and bad requests, on real uvicorn servers (one exception, named)."""

from __future__ import annotations

import httpx
import pytest

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig

CONFIG = dict(max_queries_per_request=8, max_query_chars=200, max_topk=20, max_body_bytes=4096)


class ThroughFastAPI:
    """The same app with every request handled by FastAPI's stack and its /retrieve route (the lane bypassed)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self.app.fastapi_stack(scope, receive, send)
        else:
            await self.app(scope, receive, send)


BODIES = [
    b'{"queries": ["item5", "camel"], "topk": 2}',
    b'{"queries": ["item5"], "topk": 2, "return_scores": true}',
    b'{"queries": ["item5"], "topk": null, "return_scores": "true"}',
    b'{"queries": [], "topk": 3, "return_scores": true}',
    b'{"query": "item17", "topk": 1}',
    '{"queries": ["caf\u00e9 \u00fcber \u6771\u4eac"]}'.encode(),
    b"",
    b"{not json",
    b"\xff\xfe not utf-8",
    b'["q"]',
    b"null",
    b'{"topk": 3}',
    b'{"queries": "who"}',
    b'{"queries": ["ok", 5, null]}',
    b'{"queries": ["q", "q", "q", "q", "q", "q", "q", "q", "q"]}',
    b'{"queries": ["' + b"x" * 201 + b'"]}',
    b'{"queries": ["q"], "topk": 0}',
    b'{"queries": ["q"], "topk": 2.5}',
    b'{"queries": ["q"], "topk": true}',
    b'{"queries": ["q"], "topk": "3"}',
    b'{"queries": ["q"], "query": "q"}',
    b'{"queries": ["q"], "tpok": 3, "extra": 1}',
    b'{"queries": ["q"], "return_scores": "maybe"}',
    b'{"queries": ["fine", "broken \\ud800 text"], "topk": 1}',
]


@pytest.fixture(scope="module")
def servers(animal_corpus, make_hash_engine):
    engine = make_hash_engine(animal_corpus)
    lane_app = create_app(ServerConfig(**CONFIG), engine=engine)
    route_app = create_app(ServerConfig(**CONFIG), engine=engine)
    with BackgroundServer(lane_app) as lane, BackgroundServer(ThroughFastAPI(route_app)) as route:
        yield lane, route


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b[:40].decode("utf-8", "replace"))
def test_the_lean_path_answers_as_the_fastapi_route(servers, body):
    lane, route = servers
    headers = {"content-type": "application/json"}
    a = httpx.post(f"{lane.url}/retrieve", content=body, headers=headers, timeout=30)
    b = httpx.post(f"{route.url}/retrieve", content=body, headers=headers, timeout=30)
    assert a.status_code == b.status_code
    assert a.headers["content-type"] == b.headers["content-type"] == "application/json"
    assert a.content == b.content
    assert a.headers.get("retry-after") == b.headers.get("retry-after")


def test_a_body_nested_past_the_parsers_depth_is_invalid_json(servers):
    """The one deliberate difference: FastAPI answers this 400 as a generic 'error parsing the body'."""
    lane, route = servers
    a = httpx.post(f"{lane.url}/retrieve", content=b"[" * 4_000, timeout=30)
    b = httpx.post(f"{route.url}/retrieve", content=b"[" * 4_000, headers={"content-type": "application/json"})
    assert a.status_code == b.status_code == 400 and a.json()["error"] == "invalid_json"


def test_both_paths_label_the_requests_they_refuse_in_metrics(servers):
    lane, route = servers
    for server in (lane, route):
        httpx.post(f"{server.url}/retrieve", content=b'{"queries": ["q"], "topk": 0}', timeout=30)
    metrics = httpx.get(f"{lane.url}/metrics").json()
    assert metrics["errors_by_kind"]["invalid_request"] >= 1 and metrics["requests_total"] >= 1
