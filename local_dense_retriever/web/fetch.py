"""PageFetcher: a web page for ``POST /access``, from the public internet only (a model picks the url: an SSRF
boundary). Invariant: no connection is opened to an address that was not vetted first. Every hop's host is resolved
here; every address it resolves to must be public; the connection goes to that vetted address (pinned, with the
original Host header and, for https, SNI and the certificate checked against the host name); redirects are followed
here, each hop vetted again. A body past ``max_bytes`` is cut there and its page marked ``truncated``.

Pages have the shape ``/access`` answers from the pages file: ``{"url", "title", "contents"}``, plus ``final_url``
(after redirects) and ``truncated``. Failures raise the ``FetchError`` tree of ``errors.py``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import quote, urljoin, urlsplit

import h11
from pydantic import BaseModel, ConfigDict, Field

from local_dense_retriever.web.fetch_errors import (
    AddressRefused,
    BadUrl,
    FetchError,
    FetchTimeout,
    TooManyRedirects,
    UnsupportedContent,
    UpstreamFailed,
    UpstreamStatus,
)
from local_dense_retriever.web.html_text import collapse, decode, html_text

#: media types whose text a page can hold
TEXT_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain"})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: ports below 1024 other than the web's own run other services (ssh, smtp, ...): refused
WEB_PORTS = frozenset({80, 443})
MAX_URL_CHARS = 8192
MAX_HEADER_BYTES = 64 << 10
READ_CHUNK = 64 << 10
#: NAT64 prefixes: the well-known one embeds an IPv4 address; the local-use one is a private network
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
SHARED = ipaddress.ip_network("100.64.0.0/10")
LOOPBACK_V6 = ipaddress.ip_address("::1")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
#: ranges IANA lists as not globally reachable that some Python versions' ``is_global`` still passes
NOT_GLOBAL = tuple(map(ipaddress.ip_network, ("192.0.0.0/24", "192.88.99.0/24", "3fff::/20", "5f00::/16")))

#: host, port -> the IP addresses it resolves to (blocking; run on a worker thread)
Resolver = Callable[[str, int], list[str]]
#: vetted IP, port, TLS server name (None: plain http) -> the open streams
Opener = Callable[[str, int, "str | None"], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class FetchConfig(BaseModel):
    """Limits of one page fetch. Unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_bytes: int = Field(default=2 << 20, ge=1024)
    """Most body bytes read per page; the rest is not read and the page is marked truncated."""
    deadline_s: float = Field(default=10.0, gt=0, le=300)
    """Total seconds per page: resolution, every redirect hop and the body."""
    max_redirects: int = Field(default=5, ge=0, le=20)
    """Most redirects followed per page."""
    max_concurrency: int = Field(default=16, ge=1, le=1024)
    """Most pages fetched at once by fetch_many, per event loop."""
    user_agent: str = Field(default="verl-search-page-fetcher/1", min_length=1, max_length=200, pattern=r"^[ -~]+$")
    """User-Agent header sent with every request."""
    allow_loopback: bool = False
    """Also allow loopback addresses (127.0.0.0/8, ::1): for tests against local servers only."""


@dataclass(frozen=True)
class Target:
    """A vetted URL: its scheme, ASCII host, port and request target."""

    url: str
    scheme: str
    host: str
    port: int
    path: str

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def _short(url: str) -> str:
    return url if len(url) <= 200 else url[:200] + "..."


def parse_url(url: str) -> Target:
    """``url`` as a Target, or BadUrl: http(s) only, a host, no userinfo, no control characters, a web port."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise BadUrl(f"not a url of 1 to {MAX_URL_CHARS} characters: {_short(str(url))!r}")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise BadUrl(f"url holds whitespace or control characters: {_short(url)!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise BadUrl(f"malformed url {_short(url)!r}: {e}") from e
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise BadUrl(f"only http and https urls are fetched, not {scheme or 'a relative url'}: {_short(url)!r}")
    if "@" in parts.netloc:
        raise BadUrl(f"url carries userinfo (user@host): {_short(url)!r}")
    if not parts.hostname:
        raise BadUrl(f"url has no host: {_short(url)!r}")
    port = port if port is not None else (443 if scheme == "https" else 80)
    if port == 0 or (port < 1024 and port not in WEB_PORTS):
        raise BadUrl(f"port {port} is not a web port: {_short(url)!r}")
    try:
        host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError as e:
        raise BadUrl(f"host name is not valid: {_short(url)!r}") from e
    path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    if parts.query:
        path += "?" + quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    return Target(url=parts._replace(fragment="").geturl(), scheme=scheme, host=host, port=port, path=path)


def refusal(address: str, *, allow_loopback: bool = False) -> str | None:
    """Why ``address`` is off the public internet (None: it is public). IPv4 addresses embedded in IPv6 forms
    (mapped, NAT64, 6to4) are judged as the IPv4 address they reach."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) plays no part
    if allow_loopback and (ip.version == 4 and ip.is_loopback or ip == LOOPBACK_V6):  # never a mapped form
        return None
    form = ""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL:
            return "a local-use NAT64 address"
        inner = ip.ipv4_mapped or ip.sixtofour or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None)
        if inner is None and ip in IPV4_COMPATIBLE and int(ip) > 1:
            return "an IPv4-compatible IPv6 address"
        if inner is not None:
            form, ip = f" (embedding {inner})", inner
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("shared address space (100.64.0.0/10)", isinstance(ip, ipaddress.IPv4Address) and ip in SHARED),
        ("private", ip.is_private),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
        ("reserved", ip.is_reserved),
        ("reserved for protocols or documentation", any(ip in net for net in NOT_GLOBAL)),
        ("not globally routable", not ip.is_global),
    )
    for reason, hit in checks:
        if hit:
            return reason + form
    return None


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``socket.getaddrinfo``), in its order, without repeats."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def open_pinned(
    ip: str, port: int, server_name: str | None, *, ssl_context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to ``ip`` itself; with ``server_name``, TLS whose SNI and certificate check use that name."""
    if server_name is None:
        return await asyncio.open_connection(ip, port)
    return await asyncio.open_connection(ip, port, ssl=ssl_context, server_hostname=server_name)


@dataclass
class _Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    truncated: bool = False


class PageFetcher:
    """``await fetch(url)`` -> page (or a FetchError raised); ``await fetch_many(urls)`` -> a page or the error, per
    url, fetched concurrently (at most ``max_concurrency`` at once per event loop). ``resolver`` and ``opener`` are the
    seams to the network (tests record or steer them)."""

    def __init__(
        self,
        config: FetchConfig | None = None,
        *,
        resolver: Resolver = system_resolver,
        opener: Opener | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.config = config or FetchConfig()
        self.resolver = resolver
        self.opener = opener or partial(open_pinned, ssl_context=ssl_context or ssl.create_default_context())
        self._limits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its semaphore

    async def fetch_many(self, urls: list[str]) -> list[dict | FetchError]:
        """A page or its FetchError per url, in order; one url's failure never affects another's."""
        loop = asyncio.get_running_loop()
        limit = self._limits.setdefault(loop, asyncio.Semaphore(self.config.max_concurrency))

        async def one(url: str) -> dict | FetchError:
            async with limit:
                try:
                    return await self.fetch(url)
                except FetchError as e:
                    return e

        return list(await asyncio.gather(*(one(u) for u in urls)))

    async def fetch(self, url: str) -> dict:
        """The page at ``url`` (redirects followed), within the config's deadline."""
        try:
            return await asyncio.wait_for(self._follow(url), self.config.deadline_s)
        except asyncio.TimeoutError as e:
            raise FetchTimeout(f"{_short(url)} took longer than {self.config.deadline_s:g} s") from e

    async def _follow(self, url: str) -> dict:
        seen: set[str] = set()
        current = url
        for _ in range(self.config.max_redirects + 1):
            target = parse_url(current)
            if target.url in seen:
                raise TooManyRedirects(f"{_short(url)} redirects in a loop through {_short(target.url)}")
            seen.add(target.url)
            reply = await self._get(target, await self._vetted(target))
            if reply.status not in REDIRECTS:
                return self._page(url, target, reply)
            if "location" not in reply.headers:
                raise UpstreamStatus(f"{_short(target.url)} answered {reply.status} without a Location", reply.status)
            current = urljoin(target.url, reply.headers["location"])
        raise TooManyRedirects(f"{_short(url)} redirects more than {self.config.max_redirects} times")

    async def _vetted(self, target: Target) -> list[str]:
        """The addresses ``target``'s host resolves to, once, all of them public (else AddressRefused)."""
        try:
            addresses = await asyncio.to_thread(self.resolver, target.host, target.port)
        except (OSError, UnicodeError) as e:
            raise UpstreamFailed(f"cannot resolve {target.host}: {e}") from e
        if not addresses:
            raise UpstreamFailed(f"{target.host} resolves to no address")
        for address in addresses:
            if reason := refusal(address, allow_loopback=self.config.allow_loopback):
                raise AddressRefused(f"{_short(target.url)}: {target.host} is {address}, {reason}")
        return addresses

    async def _get(self, target: Target, addresses: list[str]) -> _Reply:
        """GET ``target`` from the first vetted address that accepts; the body only for a 2xx text reply."""
        server_name = target.host if target.scheme == "https" else None
        errors = []
        for address in addresses:
            try:
                reader, writer = await self.opener(address, target.port, server_name)
                break
            except (OSError, ssl.SSLError) as e:
                errors.append(f"{address}: {e}")
        else:
            raise UpstreamFailed(f"cannot connect to {target.host}:{target.port} ({'; '.join(errors)})")
        try:
            return await self._exchange(target, reader, writer)
        except h11.ProtocolError as e:
            raise UpstreamFailed(f"{_short(target.url)} did not answer valid HTTP: {e}") from e
        except OSError as e:
            raise UpstreamFailed(f"{_short(target.url)}: connection failed: {e}") from e
        finally:
            writer.transport.abort()

    async def _exchange(self, target: Target, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Reply:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        headers = [
            ("Host", target.host_header),
            ("User-Agent", self.config.user_agent),
            ("Accept", "text/html, application/xhtml+xml, text/plain;q=0.9"),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
        ]
        writer.write(conn.send(h11.Request(method="GET", target=target.path, headers=headers)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

        async def next_event():
            while (event := conn.next_event()) is h11.NEED_DATA:
                conn.receive_data(await reader.read(READ_CHUNK))
            return event

        event = await next_event()
        while isinstance(event, h11.InformationalResponse):
            event = await next_event()
        if not isinstance(event, h11.Response):
            raise UpstreamFailed(f"{_short(target.url)} closed the connection without a reply")
        reply = _Reply(event.status_code, {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers})
        if reply.status in REDIRECTS:
            return reply
        if not 200 <= reply.status < 300:
            raise UpstreamStatus(f"{_short(target.url)} answered HTTP {reply.status}", reply.status)
        media_type, _ = _content_type(reply.headers.get("content-type", ""))
        if media_type not in TEXT_TYPES:
            raise UnsupportedContent(f"{_short(target.url)} is {media_type or 'of no declared type'}, not HTML or text")
        if reply.headers.get("content-encoding", "identity").lower() != "identity":
            raise UnsupportedContent(f"{_short(target.url)} sent a {reply.headers['content-encoding']} encoded body")
        body = bytearray()
        while isinstance(event := await next_event(), h11.Data):
            body += event.data
            if len(body) > self.config.max_bytes:
                reply.truncated = True
                break
        if not reply.truncated and not isinstance(event, h11.EndOfMessage):
            raise UpstreamFailed(f"{_short(target.url)} closed the connection mid-body")
        reply.body = bytes(body[: self.config.max_bytes])
        return reply

    def _page(self, url: str, target: Target, reply: _Reply) -> dict:
        media_type, charset = _content_type(reply.headers.get("content-type", ""))
        html = media_type != "text/plain"
        text = decode(reply.body, charset, html=html)
        title, contents = html_text(text) if html else ("", collapse(text))
        return {"url": url, "final_url": target.url, "title": title, "contents": contents, "truncated": reply.truncated}


def _content_type(value: str) -> tuple[str, str | None]:
    """(media type, lowercased; charset parameter or None) of a Content-Type header."""
    media_type, *params = value.split(";")
    charset = None
    for param in params:
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset":
            charset = val.strip().strip("\"'") or None
    return media_type.strip().lower(), charset
