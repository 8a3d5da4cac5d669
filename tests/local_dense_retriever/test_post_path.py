"""POST /retrieve and /access have one path (local_dense_retriever.middleware): each body gets the status, error kind
and detail of the wire contract, byte for byte the same whether the request reaches the guard or FastAPI's router;
/docs describes the endpoints from the same pydantic models; refused requests are labelled in /metrics."""

from __future__ import annotations

import httpx
import pytest

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.access import AccessBody
from local_dense_retriever.app import create_app
from local_dense_retriever.config import ServerConfig
from local_dense_retriever.retrieve import RetrieveBody

CONFIG = dict(max_queries_per_request=8, max_query_chars=200, max_topk=20, max_body_bytes=4096)


class ThroughFastAPI:
    """The same app with every request handled by FastAPI's stack (its router, middleware and exception handlers)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self.app.fastapi_stack(scope, receive, send)
        else:
            await self.app(scope, receive, send)


FIELD = "Input should be a valid"
#: body -> (status, error kind, detail); kind None: a 200 with this many result lists
CASES = [
    (b'{"queries": ["item5", "camel"], "topk": 2}', 200, None, 2),
    (b'{"queries": ["item5"], "topk": 2, "return_scores": true}', 200, None, 1),
    (b'{"queries": ["item5"], "topk": null, "return_scores": "true"}', 200, None, 1),
    (b'{"queries": [], "topk": 3, "return_scores": true}', 200, None, 0),
    (b'{"query": "item17", "topk": 1}', 200, None, 1),
    ('{"queries": ["caf\u00e9 \u00fcber \u6771\u4eac"]}'.encode(), 200, None, 1),
    (b"", 422, "invalid_request", "body: Field required"),
    (b"{not json", 400, "invalid_json", "request body is not valid JSON"),
    (b"\xff\xfe not utf-8", 400, "invalid_json", "request body is not valid JSON"),
    (b"[" * 4_000, 400, "invalid_json", "request body is not valid JSON"),  # nested past the parser's depth
    (b'["q"]', 422, "invalid_request", f"body: {FIELD} dictionary or object to extract fields from"),
    (b"null", 422, "invalid_request", f"body: {FIELD} dictionary or object to extract fields from"),
    (b'{"topk": 3}', 422, "invalid_request", "send either 'queries' (a list of strings) or 'query' (one string)"),
    (b'{"queries": "who"}', 422, "invalid_request", f"queries: {FIELD} list"),
    (b'{"queries": ["ok", 5, null]}', 422, "invalid_request", f"queries.1: {FIELD} string; queries.2: {FIELD} string"),
    (
        b'{"queries": ["q", "q", "q", "q", "q", "q", "q", "q", "q"]}',
        422,
        "invalid_request",
        "9 queries in one request; the limit is 8",
    ),
    (b'{"queries": ["' + b"x" * 201 + b'"]}', 422, "invalid_request", "query 0 has 201 characters; the limit is 200"),
    (b'{"queries": ["q"], "topk": 0}', 422, "invalid_request", "topk must be between 1 and 20, got 0"),
    (b'{"queries": ["q"], "topk": 2.5}', 422, "invalid_request", f"topk: {FIELD} integer"),
    (b'{"queries": ["q"], "topk": true}', 422, "invalid_request", f"topk: {FIELD} integer"),
    (b'{"queries": ["q"], "topk": "3"}', 422, "invalid_request", f"topk: {FIELD} integer"),
    (
        b'{"queries": ["q"], "query": "q"}',
        422,
        "invalid_request",
        "send either 'queries' (a list of strings) or 'query' (one string)",
    ),
    (
        b'{"queries": ["q"], "tpok": 3, "extra": 1}',
        422,
        "invalid_request",
        "tpok: Extra inputs are not permitted; extra: Extra inputs are not permitted",
    ),
    (
        b'{"queries": ["q"], "return_scores": "maybe"}',
        422,
        "invalid_request",
        f"return_scores: {FIELD} boolean, unable to interpret input",
    ),
    (
        b'{"queries": ["fine", "broken \\ud800 text"], "topk": 1}',
        422,
        "invalid_request",
        "query 1 holds a lone UTF-16 surrogate ('\\ud800' at character 7); send valid Unicode",
    ),
    (b'{"queries": ["x"]}' + b" " * 5_000, 413, "body_too_large", "request body exceeds 4096 bytes"),
]


@pytest.fixture(scope="module")
def servers(animal_corpus, make_hash_engine):
    engine = make_hash_engine(animal_corpus)
    guard_app = create_app(ServerConfig(**CONFIG), engine=engine)
    router_app = create_app(ServerConfig(**CONFIG), engine=engine)
    with BackgroundServer(guard_app) as guard, BackgroundServer(ThroughFastAPI(router_app)) as router:
        yield guard, router


@pytest.mark.parametrize(("body", "status", "kind", "detail"), CASES, ids=lambda b: str(b)[:40])
def test_each_body_gets_its_answer_by_either_entry(servers, body, status, kind, detail):
    guard, router = servers
    headers = {"content-type": "application/json"}
    a = httpx.post(f"{guard.url}/retrieve", content=body, headers=headers, timeout=30)
    b = httpx.post(f"{router.url}/retrieve", content=body, headers=headers, timeout=30)
    assert a.status_code == status
    if kind is None:
        assert len(a.json()["result"]) == detail
    else:
        assert a.json() == {"error": kind, "detail": detail}
    assert a.headers["content-type"] == "application/json"
    assert (b.status_code, b.headers["content-type"], b.content) == (a.status_code, "application/json", a.content)


def test_access_refusals_name_the_field(servers):
    guard, _ = servers
    r = httpx.post(f"{guard.url}/access", content=b'{"urls": ["a"], "queries": ["q"]}', timeout=30)
    assert r.status_code == 422 and r.json() == {"error": "invalid_request", "detail": "queries: Extra inputs are "
                                                 "not permitted"}  # fmt: skip
    r = httpx.post(f"{guard.url}/access", content=b'{"urls": [' + b",".join([b'"u"'] * 9) + b"]}", timeout=30)
    assert r.status_code == 422 and r.json()["detail"] == "9 urls; the limit is 8"


def test_other_methods_and_paths_keep_fastapis_answers(servers):
    guard, _ = servers
    r = httpx.get(f"{guard.url}/retrieve", timeout=30)
    assert r.status_code == 405 and r.json() == {"error": "method_not_allowed", "detail": "Method Not Allowed"}
    r = httpx.post(f"{guard.url}/retrieve/", content=b'{"queries": ["a"]}', timeout=30)
    assert r.status_code == 307 and r.headers["location"].endswith("/retrieve")


def test_docs_describe_the_endpoints_from_the_served_models(servers):
    guard, _ = servers
    schema = httpx.get(f"{guard.url}/openapi.json", timeout=30).json()
    for path, model in (("/retrieve", RetrieveBody), ("/access", AccessBody)):
        post = schema["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(model.__name__)
        assert set(schema["components"]["schemas"][model.__name__]["properties"]) == set(model.model_fields)
        assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
    ok = schema["paths"]["/retrieve"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("RetrieveResponse")


def test_refused_requests_are_labelled_in_metrics(servers):
    guard, _ = servers
    before = httpx.get(f"{guard.url}/metrics").json()
    httpx.post(f"{guard.url}/retrieve", content=b'{"queries": ["q", "r"], "topk": 0}', timeout=30)
    httpx.post(f"{guard.url}/retrieve", content=b"{not json", timeout=30)
    after = httpx.get(f"{guard.url}/metrics").json()
    for kind in ("invalid_request", "invalid_json"):
        assert after["errors_by_kind"][kind] == before["errors_by_kind"].get(kind, 0) + 1
    assert after["requests_total"] == before["requests_total"] + 2
    assert after["queries_total"] == before["queries_total"] + 2  # a body that parsed counts its queries
