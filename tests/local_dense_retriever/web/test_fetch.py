"""The page fetcher of POST /access: every non-public address is refused before any connection, redirects are vetted
hop by hop, and the limits (size, deadline, content type) hold, against real stub servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cpu_bench.background_server import BackgroundServer
from local_dense_retriever.web.fetch import FetchConfig, PageFetcher, open_pinned, refusal, system_resolver
from local_dense_retriever.web.fetch_errors import (
    AddressRefused,
    BadUrl,
    FetchTimeout,
    TooManyRedirects,
    UnsupportedContent,
    UpstreamFailed,
    UpstreamStatus,
)

ARTICLE = """<!doctype html><html><head><title>Paul  Walker &amp; cars</title><meta charset="utf-8">
<style>body { color: red }</style><script>var secret = "<p>not text</p>";</script></head>
<body><noscript>Please enable JavaScript</noscript><h1>Paul Walker</h1>
<p>Paul William   Walker IV was an
 American actor.</p><p>Host {host}</p><template>hidden template</template></body></html>"""


async def article(request: Request) -> Response:
    return Response(ARTICLE.replace("{host}", request.headers["host"]), media_type="text/html")


def typed(body: bytes, content_type: str | None, **headers: str):
    async def route(request: Request) -> Response:
        response = Response(body, headers=headers)
        if content_type is not None:
            response.headers["content-type"] = content_type
        return response

    return route


async def redirect(request: Request) -> Response:
    return Response(status_code=302, headers={"location": request.query_params["to"]})


def redirect_to(location: str):
    async def route(request: Request) -> Response:
        return Response(status_code=302, headers={"location": location})

    return route


async def hop(request: Request) -> Response:
    n = int(request.path_params["n"])
    return Response(status_code=301, headers={"location": f"/hop/{n - 1}"}) if n > 0 else await article(request)


async def status(request: Request) -> Response:
    return Response("error page", status_code=int(request.path_params["code"]), media_type="text/html")


async def drip(request: Request) -> Response:
    async def forever():
        while True:
            yield b"<p>more</p>"
            await asyncio.sleep(0.05)

    return StreamingResponse(forever(), media_type="text/html")


IN_FLIGHT = {"now": 0, "most": 0}


async def held(request: Request) -> Response:
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["most"] = max(IN_FLIGHT["most"], IN_FLIGHT["now"])
    await asyncio.sleep(0.1)
    IN_FLIGHT["now"] -= 1
    return Response(f"<p>held {request.path_params['i']}</p>", media_type="text/html")


APP = Starlette(
    routes=[
        Route("/article", article),
        Route("/plain", typed(b"line one\n\n\n  line   two\n", "text/plain; charset=utf-8")),
        Route("/latin1", typed("<p>caf\u00e9</p>".encode("latin-1"), "text/html; charset=ISO-8859-1")),
        Route("/meta", typed('<meta charset="windows-1252"><p>\x93quoted\x94</p>'.encode("latin-1"), "text/html")),
        Route("/bogus", typed("<p>na\u00efve</p>".encode(), 'text/html; charset="x-no-such-codec"')),
        Route("/big", typed(b"word " * 40_000, "text/plain")),
        Route("/json", typed(b'{"a": 1}', "application/json")),
        Route("/png", typed(b"\x89PNG\r\n\x1a\n", "image/png")),
        Route("/untyped", typed(b"<p>x</p>", None)),
        Route("/gzip", typed(b"\x1f\x8b\x08\x00", "text/html", **{"content-encoding": "gzip"})),
        Route("/redirect", redirect),
        Route("/loop/a", redirect_to("/loop/b")),
        Route("/loop/b", redirect_to("/loop/a")),
        Route("/hop/{n}", hop),
        Route("/status/{code}", status),
        Route("/drip", drip),
        Route("/held/{i}", held),
    ]
)

#: names the tests' resolver knows; any other name fails the test instead of reaching a real DNS server
NAMES = {
    "stub.test": ["127.0.0.1"],
    "site.test": ["127.0.0.1"],
    "other.test": ["127.0.0.1"],
    "intranet.test": ["10.0.0.5"],
    "mixed.test": ["93.184.216.34", "10.0.0.5"],
}


def test_resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return NAMES[host]
    if host == "localhost":
        return system_resolver(host, port)
    try:
        ipaddress.ip_address(host)
    except ValueError as e:
        raise AssertionError(f"the test resolver does not know {host}") from e
    return [host]


test_resolver.__test__ = False  # a helper, not a test

pytestmark = pytest.mark.usefixtures("only_loopback_connections")  # any connection off this machine fails a test


class Recorder:
    """An opener that records each (address, port, TLS name) it is asked for, then connects for real."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connects: list[tuple[str, int, str | None]] = []
        self.ssl_context = ssl_context or ssl.create_default_context()

    async def __call__(self, ip: str, port: int, server_name: str | None):
        self.connects.append((ip, port, server_name))
        return await open_pinned(ip, port, server_name, ssl_context=self.ssl_context)


async def never_connect(ip: str, port: int, server_name: str | None):
    raise AssertionError(f"connected to {ip}:{port} though it should have been refused")


@pytest.fixture(scope="module")
def stub():
    with BackgroundServer(APP) as server:
        yield server


def fetcher(recorder=None, **config) -> PageFetcher:
    config = {"allow_loopback": True, "deadline_s": 5.0, **config}
    return PageFetcher(FetchConfig(**config), resolver=test_resolver, opener=recorder or Recorder())


REFUSED = [
    "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
    "240.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.0.8", "::1", "::", "fe80::1", "fc00::1", "fec0::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1",
    "64:ff9b:1::808:808", "2002:a9fe:a9fe::1", "2002:7f00:1::1", "::7f00:1", "2001::1", "2001:db8::1",
    "3fff::1", "5f00::1",
]  # fmt: skip


@pytest.mark.parametrize("address", REFUSED)
async def test_every_non_public_address_literal_is_refused_before_any_connection(address):
    host = f"[{address}]" if ":" in address else address
    pages = PageFetcher(FetchConfig(), opener=never_connect)  # the real resolver: a literal needs no lookup
    with pytest.raises(AddressRefused, match=address.replace(".", r"\.")):
        await pages.fetch(f"http://{host}/latest/meta-data/")


async def test_loopback_allowed_for_tests_opens_loopback_only():
    pages = PageFetcher(FetchConfig(allow_loopback=True), opener=never_connect)
    for address in ("10.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "0.0.0.0"):
        with pytest.raises(AddressRefused):
            await pages.fetch(f"http://[{address}]/" if ":" in address else f"http://{address}/")


def test_public_addresses_and_their_embedded_forms_pass():
    for address in ("8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808",
                    "2002:808:808::1"):  # fmt: skip
        assert refusal(address) is None, address
    assert "link-local" in refusal("::ffff:169.254.169.254") and "embedding 169.254.169.254" in refusal(
        "2002:a9fe:a9fe::1"
    )


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd", "ftp://example.com/x", "gopher://example.com/", "data:text/html,<p>x</p>",
        "javascript:alert(1)", "http://", "//example.com/x", "/relative", "http://user@example.com/",
        "http://user:secret@example.com/", "http://example.com@10.0.0.1/", "http://example.com:22/",
        "http://example.com:0/", "http://example.com:99999/", "http://exa mple.com/", "http://example.com/\r\nX: y",
        "http://a..b/", "", "http://example.com/" + "a" * 9000,
    ],
)  # fmt: skip
async def test_urls_that_are_not_plain_http_or_https_are_refused_before_resolving(url):
    def resolver(host, port):
        raise AssertionError(f"resolved {host} for a refused url")

    pages = PageFetcher(FetchConfig(), resolver=resolver, opener=never_connect)
    with pytest.raises(BadUrl):
        await pages.fetch(url)


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "017700000001"])
async def test_numeric_spellings_of_loopback_are_resolved_then_refused(host):
    with pytest.raises(AddressRefused, match="127.0.0.1"):
        await PageFetcher(FetchConfig(), opener=never_connect).fetch(f"http://{host}/")


@pytest.mark.parametrize("host", ["intranet.test", "mixed.test", "localhost"])
async def test_a_name_resolving_to_any_private_address_is_refused(host):
    pages = PageFetcher(FetchConfig(), resolver=test_resolver, opener=never_connect)
    with pytest.raises(AddressRefused, match=host):
        await pages.fetch(f"https://{host}/page")


async def test_a_page_is_fetched_from_the_vetted_address_with_its_own_host_name(stub):
    recorder = Recorder()
    page = await fetcher(recorder).fetch(f"http://stub.test:{stub.port}/article#section")
    assert page["url"] == f"http://stub.test:{stub.port}/article#section"
    assert page["final_url"] == f"http://stub.test:{stub.port}/article" and page["truncated"] is False
    assert page["title"] == "Paul Walker & cars"
    assert page["contents"] == (
        f"Paul Walker\nPaul William Walker IV was an American actor.\nHost stub.test:{stub.port}"
    )  # no script, style, noscript or template text; the server saw the original Host
    assert recorder.connects == [("127.0.0.1", stub.port, None)]  # pinned: the resolved address, not the name


async def test_the_host_is_resolved_once_per_hop_so_a_rebinding_answer_is_never_used(stub):
    answers = iter([["127.0.0.1"], ["10.0.0.9"], ["10.0.0.9"]])
    asked = []

    def rebinding(host, port):
        asked.append(host)
        return next(answers)

    recorder = Recorder()
    pages = PageFetcher(FetchConfig(allow_loopback=True), resolver=rebinding, opener=recorder)
    page = await pages.fetch(f"http://rebind.test:{stub.port}/plain")
    assert page["contents"] == "line one\nline two"
    assert asked == ["rebind.test"] and recorder.connects == [("127.0.0.1", stub.port, None)]


@pytest.mark.parametrize(
    ("location", "error"),
    [
        ("http://169.254.169.254/latest/meta-data/", AddressRefused),
        ("http://[fe80::1]/", AddressRefused),
        ("http://intranet.test/admin", AddressRefused),
        ("http://10.0.0.1:8080/", AddressRefused),
        ("file:///etc/passwd", BadUrl),
        ("http://user@stub.test/", BadUrl),
    ],
)
async def test_a_redirect_to_a_refused_place_is_refused_without_connecting_there(stub, location, error):
    recorder = Recorder()
    with pytest.raises(error):
        await fetcher(recorder).fetch(f"http://stub.test:{stub.port}/redirect?to={location}")
    assert recorder.connects == [("127.0.0.1", stub.port, None)]  # the stub only


async def test_redirects_are_followed_up_to_the_limit(stub):
    recorder = Recorder()
    page = await fetcher(recorder, max_redirects=3).fetch(f"http://stub.test:{stub.port}/hop/3")
    assert page["final_url"] == f"http://stub.test:{stub.port}/hop/0" and page["title"] == "Paul Walker & cars"
    assert len(recorder.connects) == 4
    with pytest.raises(TooManyRedirects, match="more than 3"):
        await fetcher(max_redirects=3).fetch(f"http://stub.test:{stub.port}/hop/4")


async def test_a_redirect_loop_is_refused(stub):
    with pytest.raises(TooManyRedirects, match="loop"):
        await fetcher().fetch(f"http://stub.test:{stub.port}/loop/a")


async def test_a_body_past_the_size_limit_is_cut_and_marked_truncated(stub):
    page = await fetcher(max_bytes=4096).fetch(f"http://stub.test:{stub.port}/big")
    assert page["truncated"] is True
    assert 4000 < len(page["contents"]) <= 4096 and all("word".startswith(w) for w in page["contents"].split())


async def test_a_server_that_never_answers_hits_the_deadline():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with pytest.raises(FetchTimeout, match="0.5 s"):
            await fetcher(deadline_s=0.5).fetch(f"http://stub.test:{port}/")


async def test_a_body_that_never_ends_hits_the_deadline(stub):
    with pytest.raises(FetchTimeout):
        await fetcher(deadline_s=0.5, max_bytes=1 << 30).fetch(f"http://stub.test:{stub.port}/drip")


@pytest.mark.parametrize("path", ["/json", "/png", "/untyped", "/gzip"])
async def test_content_that_is_not_html_or_text_is_refused(stub, path):
    with pytest.raises(UnsupportedContent):
        await fetcher().fetch(f"http://stub.test:{stub.port}{path}")


@pytest.mark.parametrize("code", [404, 500, 503])
async def test_an_error_status_is_a_typed_error_with_the_status(stub, code):
    with pytest.raises(UpstreamStatus) as err:
        await fetcher().fetch(f"http://stub.test:{stub.port}/status/{code}")
    assert err.value.status == code and "error page" not in str(err.value)


async def test_a_closed_port_is_an_upstream_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(UpstreamFailed, match="cannot connect"):
            await fetcher().fetch(f"http://stub.test:{port}/")


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("/latin1", "caf\u00e9"),
        ("/meta", "\u201cquoted\u201d"),
        ("/bogus", "na\u00efve"),
        ("/plain", "line one\nline two"),
    ],
)
async def test_text_is_decoded_by_the_declared_charset_with_a_utf8_fallback(stub, path, text):
    assert (await fetcher().fetch(f"http://stub.test:{stub.port}{path}"))["contents"] == text


async def test_fetch_many_answers_in_order_and_bounds_concurrency(stub):
    IN_FLIGHT.update(now=0, most=0)
    urls = [f"http://stub.test:{stub.port}/held/{i}" for i in range(6)]
    urls.insert(2, "http://10.0.0.1/")
    results = await fetcher(max_concurrency=2).fetch_many(urls)
    assert isinstance(results[2], AddressRefused)
    assert [r["contents"] for r in results if isinstance(r, dict)] == [f"held {i}" for i in range(6)]
    assert IN_FLIGHT["most"] == 2  # concurrent, and never more than the bound


@pytest.fixture(scope="module")
def tls_stub(tmp_path_factory):
    """The stub app over https with a self-signed certificate for site.test, and a context trusting it."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("site.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tls")
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (folder / "cert.pem").write_bytes(cert_pem)
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(cadata=cert_pem.decode())
    with BackgroundServer(APP, ssl_certfile=str(folder / "cert.pem"), ssl_keyfile=str(folder / "key.pem")) as server:
        yield server, context


async def test_https_checks_the_certificate_against_the_host_name_not_the_pinned_address(tls_stub):
    server, context = tls_stub
    recorder = Recorder(context)
    page = await fetcher(recorder).fetch(f"https://site.test:{server.port}/article")
    assert page["title"] == "Paul Walker & cars" and f"Host site.test:{server.port}" in page["contents"]
    assert recorder.connects == [("127.0.0.1", server.port, "site.test")]
    with pytest.raises(UpstreamFailed, match="certificate"):  # same address, a name the certificate does not hold
        await fetcher(Recorder(context)).fetch(f"https://other.test:{server.port}/article")
