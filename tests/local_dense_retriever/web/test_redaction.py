"""A provider that echoes the key (raw, percent-encoded in either case, JSON-escaped; in its error text, its headers,
the request url it quotes) has it reach neither the client nor the log, wherever the text is cut."""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

import httpx
import pytest

from local_dense_retriever.web.errors import UpstreamError
from local_dense_retriever.web.redact import Redactor

ALL = pytest.mark.parametrize("provider", ["serper", "serpapi", "brave"], indirect=True)
#: a key holding the characters that encodings change
KEY = "Zq+7/Wx=Pm3+Kd9/Rt2=Hv8+Lb4/Ny6=Gc"
ENV = {"serper": "SERPER_API_KEY", "serpapi": "SERPAPI_API_KEY", "brave": "BRAVE_API_KEY"}


def encodings(key: str) -> list[str]:
    """The forms a provider may echo ``key`` in."""
    upper = quote(key, safe="")
    escaped = json.dumps(key).strip('"').replace("/", "\\/")
    unicode = "".join(f"\\u{ord(c):04x}" if c in "+/=" else c for c in key)
    return [key, upper, upper.replace("%2B", "%2b").replace("%2F", "%2f").replace("%3D", "%3d"), escaped, unicode,
            quote(key, safe="/"), key.replace("+", " ")]  # fmt: skip


def leaks(text: str, key: str = KEY) -> list[str]:
    """Pieces of six characters of any encoding of ``key`` found in ``text``."""
    return [form[i : i + 6] for form in encodings(key) for i in range(len(form) - 5) if form[i : i + 6] in text]


@pytest.fixture
def keyed(provider, monkeypatch):
    monkeypatch.setenv(ENV[provider.provider], KEY)
    return provider


def test_the_redactor_masks_every_encoding_and_a_cut_piece_before_it_cuts():
    redactor = Redactor(KEY)
    for form in encodings(KEY):
        for offset in range(0, 260):
            kept = redactor.clean("x" * offset + form + " is not a valid key", limit=200)
            assert not leaks(kept), (form, offset, kept)
    assert not leaks(redactor.clean(f"key {KEY[:12]}... is invalid and ...{KEY[-9:]}"))


@ALL
def test_a_key_echoed_in_the_error_text_is_cut_at_every_offset_and_reaches_no_client_or_log(
    keyed, web_backend, fault, caplog
):
    caplog.set_level(logging.DEBUG)
    forms = encodings(KEY)
    messages = [f"{'x' * offset}{form} is invalid" for form in forms for offset in range(200 - len(form), 201, 3)]
    keyed.plan.extend(fault(status=401, message=m) for m in messages)
    failed = web_backend().search([f"query {i}" for i in range(len(messages))], 2)
    assert all(isinstance(f, UpstreamError) for f in failed)
    expected = f"upstream_error: {keyed.provider} answered an error status (HTTP 401, after 1 attempt)"
    for error in failed:
        assert str(error) == expected
        assert "invalid" not in str(error) and not leaks(str(error))
    assert "it said: xxx" in caplog.text  # the operator reads the provider's text, redacted
    assert not leaks(caplog.text) and not leaks(repr([r.__dict__ for r in caplog.records]))


@ALL
def test_a_key_echoed_in_the_quoted_request_url_and_headers_reaches_no_client_or_log(keyed, web_backend, fault, caplog):
    caplog.set_level(logging.DEBUG)
    echo = {"x-echo": KEY, "location": f"https://example.org/?api_key={quote(KEY, safe='')}"}
    keyed.plan.extend([
        fault(status=400, message="bad request to {target} with {headers}", headers=echo),
        fault(status=302, message="moved {target}", headers=echo),
        fault(status=429, message="slow down: {headers}", retry_after=KEY, headers=echo),
        fault(status=429, message="still {target}", headers=echo),
    ])  # fmt: skip
    failed = web_backend(web_max_attempts=2).search(["first echo", "second echo", "third echo"], 2)
    assert all(isinstance(f, UpstreamError) for f in failed) and len(keyed.requests) == 4
    if keyed.provider == "serpapi":
        assert quote(KEY, safe="/") in caplog.text or "***" in caplog.text
    assert "***" in caplog.text and not leaks(caplog.text)
    assert not [f for f in failed if leaks(str(f))]


@pytest.mark.parametrize("provider", ["serpapi", "brave"], indirect=True)
def test_a_200_error_body_echoing_the_key_reaches_no_client_or_log(keyed, web_backend, fault, caplog):
    caplog.set_level(logging.DEBUG)
    said = f"Invalid key {quote(KEY, safe='')} ({KEY})"
    body = {"error": said} if keyed.provider == "serpapi" else {"type": "ErrorResponse", "error": {"detail": said}}
    keyed.plan.append(fault(raw=json.dumps(body).encode()))
    [failed] = web_backend().search(["two hundred"], 2)
    assert isinstance(failed, UpstreamError) and f"{keyed.provider} answered an error (HTTP 200" in str(failed)
    assert "Invalid key ***" in caplog.text and not leaks(caplog.text) and not leaks(str(failed))


@ALL
def test_the_client_detail_names_provider_status_and_kind_and_none_of_the_providers_text(
    keyed, web_server, fault, caplog
):
    caplog.set_level(logging.DEBUG)
    keyed.plan.append(fault(status=403, message=f"{'y' * 190}{KEY} is not allowed for {{target}}"))
    url, _ = web_server()
    answer = httpx.post(f"{url}/retrieve", json={"queries": ["forbidden"], "topk": 2})
    body = answer.json()
    assert answer.status_code == 502 and body["error"] == "upstream_error"
    assert body["detail"] == f"upstream_error: {keyed.provider} answered an error status (HTTP 403, after 1 attempt)"
    assert not leaks(answer.text) and not leaks(caplog.text) and "yyyy" in caplog.text
