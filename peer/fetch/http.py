"""The node's HTTP fetcher: HTTP/1.1 (`peer.fetch.h1`) or HTTP/2 by ALPN (`peer.fetch.h2client`) over trio
streams, a per-origin keep-alive pool, the node's DNS, per-host policies (HTTP/2, proxies, TLS:
`peer.fetch.policy`).

Measured on this machine (``tests/bench/bench_http.py``), httpx's own pool collapses over many hosts, and its
client layer alone costs about as much CPU per request as this whole fetch path; so the crawl engine calls
``Fetcher`` directly, and tools that want httpx's API get it through ``HttpxTransport``, a transport over the
same fetcher. The address comes
from the node's resolver (cached, checked against private ranges) and is the one connected to: the name goes
only into the Host header and TLS SNI, never to a second resolver. Redirects are returned, not followed: the
engine routes a Location like any discovered link, since in a cluster it may belong to another node.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import TracebackType
from typing import Protocol, Self
from urllib.parse import quote, urlsplit

import httpx
import trio

from peer.config import DEFAULTS
from peer.fetch import h1
from peer.fetch.h2client import StreamRefused
from peer.fetch.policy import HostPolicies, HostPolicy
from peer.fetch.proxies import Proxy, ProxyError, ProxyRefused
from peer.fetch.decoding import BodyDecoder, DecodeError, make_decoder
from peer.fetch.pool import (
    Connection,
    ConnectionPool,
    OriginKey,
    default_max_idle_total,
    open_connection,
)
from peer.fetch.dns import Resolver
from peer.fetch.errors import (
    AddressRefused,
    ConnectFailed,
    ConnectTimeout,
    CorruptBody,
    DnsError,
    FetchError,
    FetchTimeout,
    HttpProtocolError,
    InvalidUrl,
    ProxyFailed,
    ReadTimeout,
    RefusedAddress,
    ResolveFailed,
    ResponseTooLarge,
    TlsCertificateFailed,
    TlsFailed,
    TlsVersionFailed,
)

__all__ = ["BodySink", "FetchError", "Fetcher", "HttpxTransport", "Response"]

_CHUNK = 65536  # read in large chunks: one receive per 15 KB page on loopback
_MAX_HEAD = 65536  # status line plus headers; some sites send large cookies and CSP headers
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NOT_FROM_CALLER = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_SAFE_TARGET = "!#$%&'()*+,/:;=?@[]~"


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """What a fetch returned. ``headers`` as received (names lower-case); ``body`` already decoded from its
    Content-Encoding and cut at ``max_body`` (then ``truncated``); ``request_headers`` as sent (for WARC)."""

    url: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    ip: str
    truncated: bool
    elapsed: float
    request_headers: list[tuple[str, str]]
    protocol: str = "http/1.1"  # ALPN name of what carried the exchange: "h2" or "http/1.1"


class BodySink(Protocol):
    """Where a streamed body goes instead of into ``Response.body`` (a sitemap reader, say).

    ``head`` sees the status and headers first and answers whether to stream the body at all (no: the fetch
    stops reading and the body is dropped); ``write`` takes each decoded piece as it arrives and answers
    whether to go on (it may await, to let other tasks run while it works through a piece). ``max_bytes`` replaces the fetcher's ``max_body`` for this response.
    """

    max_bytes: int

    def head(self, status: int, headers: list[tuple[str, str]]) -> bool: ...

    async def write(self, piece: bytes) -> bool: ...


#: With a sink, one network read may inflate (Content-Encoding) to at most this much before the body is cut,
#: so a bomb never sits in memory; a sink's own decoder (a .gz sitemap) takes the rest in steps of its own.
_SINK_STEP = 4 * 2**20


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before it answered: retry on a fresh one."""


class Fetcher:
    """An async context manager that fetches URLs; closes its idle connections on exit.

    ``connect_timeout`` bounds the TCP and TLS handshakes, ``read_timeout`` each wait for data,
    ``total_timeout`` the whole fetch including DNS and waiting for the origin's connection slot.
    ``policies`` say per host whether to offer HTTP/2, which proxies to go through and which TLS settings to
    use (default: HTTP/2 offered, direct, the system's CAs); an ``ssl_context`` given replaces every host's
    TLS settings (its ALPN is set to offer HTTP/2 if the default policy does).
    """

    def __init__(
        self,
        resolver: Resolver,
        *,
        user_agent: str,
        connect_timeout: float = DEFAULTS["connect_timeout"],
        read_timeout: float = DEFAULTS["read_timeout"],
        total_timeout: float = DEFAULTS["total_timeout"],
        max_body: int = DEFAULTS["max_body"],
        max_connections_per_origin: int = 1,
        max_idle_per_origin: int = 1,
        idle_timeout: float = 30.0,
        max_idle_total: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
        policies: HostPolicies | None = None,
    ) -> None:
        if not user_agent:
            raise ValueError("user_agent must name the crawler (and ideally a contact URL)")
        if max_body < 0:
            raise ValueError(f"max_body must be >= 0, got {max_body}")
        self._resolver = resolver
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._total_timeout = total_timeout
        self._max_body = max_body
        self._idle_timeout = idle_timeout
        self._pool = ConnectionPool(
            max_connections_per_origin=max_connections_per_origin,
            max_idle_per_origin=max_idle_per_origin,
            max_idle_total=default_max_idle_total() if max_idle_total is None else max_idle_total,
            idle_timeout=idle_timeout,
        )
        self._policies = policies if policies is not None else HostPolicies(HostPolicy())
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(list(self._policies.default.alpn()))
        self._ssl_context = ssl_context
        self._defaults = [("user-agent", user_agent), ("accept-encoding", "gzip, deflate, br"), ("accept", "*/*")]

    @property
    def pool(self) -> ConnectionPool:
        return self._pool

    @property
    def policies(self) -> HostPolicies:
        return self._policies

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._pool.close_all()

    async def fetch(
        self,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        sink: BodySink | None = None,
        address: str | None = None,
    ) -> Response:
        """GET ``url``. Redirects are returned as they are; raises FetchError. With ``sink`` the body is
        streamed to it and ``Response.body`` is empty; with ``address`` (one `address` gave) the request goes
        there instead of to a fresh look-up."""
        return await self.request("GET", url, headers=headers, sink=sink, address=address)

    async def address(self, host: str) -> str:
        """The address requests to ``host`` go to now: the node's resolver (cached; refused ranges refused).
        Raises DnsError."""
        return await self._resolver.resolve(host)

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        content: bytes = b"",
        sink: BodySink | None = None,
        address: str | None = None,
    ) -> Response:
        """Send one request (any method, optional body) and read the whole response (or stream it to
        ``sink``); raises FetchError."""
        start = trio.current_time()
        scheme, host, port, target, host_header = _split_url(url)
        request_headers = self._request_headers(host_header, headers, method, content)
        key: OriginKey = (scheme, host, port)
        deadline = start + self._total_timeout
        # One cancel scope per request: its deadline is the whole-request limit, pulled in to "now +
        # read_timeout" before each wait for data, so the reason it fired is read off the deadline it had.
        with trio.CancelScope(deadline=deadline) as scope:
            try:
                ip = address if address is not None else await self._resolver.resolve(host)
            except RefusedAddress as exc:
                raise AddressRefused(f"{url}: {exc}") from exc
            except DnsError as exc:
                raise ResolveFailed(f"{url}: {exc}") from exc
            origin = await self._pool.acquire(key)
            try:
                for _ in range(2):
                    scope.deadline = deadline
                    conn = self._pool.take_idle(origin, trio.current_time())
                    if conn is None:
                        conn = await self._connect(key, ip, host, url)
                    reused = conn.requests > 0
                    try:
                        head, body, truncated, reusable = await self._exchange(
                            conn, method, target, request_headers, content, url, reused, scope, deadline, sink
                        )
                    except _StaleConnection:
                        conn.close()
                        continue
                    except BaseException:
                        conn.close()
                        raise
                    if not truncated and reusable:
                        conn.requests += 1
                        self._pool.put_idle(origin, conn, trio.current_time())
                    else:
                        conn.close()
                    return Response(
                        url=url,
                        status=head.status,
                        reason=head.reason,
                        headers=head.headers,
                        body=body,
                        ip=ip,
                        truncated=truncated,
                        elapsed=trio.current_time() - start,
                        request_headers=request_headers,
                        protocol=conn.protocol,
                    )
                raise HttpProtocolError(f"{url}: the server closed two connections without answering")
            finally:
                self._pool.release(key, origin)
        if scope.deadline < deadline:
            raise ReadTimeout(f"{url}: no data from the server for {self._read_timeout:g} s")
        raise FetchTimeout(f"{url}: no complete response within {self._total_timeout:g} s")

    def _request_headers(
        self, host_header: str, headers: Sequence[tuple[str, str]], method: str, content: bytes
    ) -> list[tuple[str, str]]:
        if not headers:
            out = [("host", host_header), *self._defaults]
        else:
            given = {name.lower() for name, _ in headers}
            out = [("host", host_header)]
            out += [d for d in self._defaults if d[0] not in given]
            out += [(n, v) for n, v in headers if n.lower() not in _NOT_FROM_CALLER]
        if content or method in ("POST", "PUT", "PATCH"):
            out.append(("content-length", str(len(content))))
        return out

    async def _connect(self, key: OriginKey, ip: str, host: str, url: str) -> Connection:
        """A new connection to ``ip`` for ``host``, with the host's TLS settings and through its proxies: a
        proxy that fails is rested and the next one tried, each at most once, within ``connect_timeout``."""
        policy = self._policies.for_host(host)
        tls = None
        if key[0] == "https":
            tls = self._ssl_context if self._ssl_context is not None else policy.ssl_context()
        proxies = policy.proxies
        tries = 1 if proxies is None else len(proxies.proxies)
        where = f"{ip}:{key[2]}"
        proxy: Proxy | None = None
        with trio.move_on_after(self._connect_timeout):
            for attempt in range(tries):
                proxy = None if proxies is None else proxies.choose(trio.current_time())
                if proxy is not None:
                    where = f"{ip}:{key[2]} through {proxy.url}"
                try:
                    conn = await open_connection(key, ip, host, tls, _MAX_HEAD, proxy)
                except ProxyError as exc:
                    assert proxies is not None and proxy is not None
                    proxies.failed(proxy, trio.current_time())
                    if attempt + 1 < tries and proxies.any_healthy(trio.current_time()):
                        continue
                    raise ProxyFailed(f"{url}: {exc}") from exc
                except ProxyRefused as exc:
                    raise ConnectFailed(f"{url}: {exc} (to {where})") from exc
                except ssl.SSLError as exc:
                    raise _tls_error(exc)(f"{url}: TLS handshake with {where} failed: {_tls_reason(exc)}") from exc
                except trio.BrokenResourceError as exc:
                    cause = exc.__cause__
                    if isinstance(cause, ssl.SSLError):
                        raise _tls_error(cause)(
                            f"{url}: TLS handshake with {where} failed: {_tls_reason(cause)}") from exc
                    raise TlsFailed(f"{url}: {where} closed the connection during the TLS handshake") from exc
                except OSError as exc:
                    raise ConnectFailed(f"{url}: cannot connect to {where}: {exc.strerror or exc}") from exc
                if proxy is not None:
                    assert proxies is not None
                    proxies.worked(proxy)
                return conn
        if proxies is not None and proxy is not None:
            proxies.failed(proxy, trio.current_time())
        raise ConnectTimeout(f"{url}: connecting to {where} took over {self._connect_timeout:g} s")

    async def _exchange(
        self,
        conn: Connection,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        content: bytes,
        url: str,
        reused: bool,
        scope: trio.CancelScope,
        deadline: float,
        sink: BodySink | None = None,
    ) -> tuple[h1.Head, bytes, bool, bool]:
        """Send the request and read the response: (head, decoded body, truncated, whether the connection may
        carry another request). With ``sink``, the decoded body goes to it piece by piece and the body returned
        is empty."""
        session = conn.h2
        try:
            if session is not None:
                data = session.request(method, conn.key[0], target, headers, content)
            elif conn.absolute_form:
                data = h1.request_bytes(method, _absolute(conn.key, target), headers + conn.proxy_headers, content)
            else:
                data = h1.request_bytes(method, target, headers, content)
        except h1.LocalProtocolError as exc:
            raise HttpProtocolError(f"{url}: cannot send this request: {exc}") from exc
        try:
            await conn.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if reused:
                raise _StaleConnection from exc
            raise HttpProtocolError(f"{url}: the connection broke while sending the request") from exc

        max_body = self._max_body if sink is None else sink.max_bytes
        step = max_body if sink is None else _SINK_STEP
        read_timeout = self._read_timeout
        h = h1.ResponseReader(method, max_head=conn.max_head) if session is None else session
        head: h1.Head | None = None
        decoder: BodyDecoder | None = None
        chunks: list[bytes] = []
        size = 0
        raw_size = 0
        head_size = 0
        received = False
        truncated = False
        try:
            while True:
                event = h.next_event()
                if event is h1.NEED_DATA:
                    read_deadline = trio.current_time() + read_timeout
                    scope.deadline = min(deadline, read_deadline)
                    try:
                        chunk = await conn.receive_some(_CHUNK)
                    except trio.BrokenResourceError as exc:
                        if reused and not received:
                            raise _StaleConnection from exc
                        raise HttpProtocolError(f"{url}: the connection broke mid-response") from exc
                    if chunk:
                        received = True
                        if head is None:
                            head_size += len(chunk)
                            if head_size > _MAX_HEAD:
                                raise ResponseTooLarge(f"{url}: response head exceeds {_MAX_HEAD} bytes")
                    elif not received:
                        if reused:
                            raise _StaleConnection
                        raise HttpProtocolError(f"{url}: the server closed the connection without a response")
                    h.receive_data(chunk)
                    if session is not None:
                        owed = session.outgoing()  # settings and ping acks, window updates
                        if owed:
                            try:
                                await conn.send_all(owed)
                            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                                raise HttpProtocolError(f"{url}: the connection broke mid-response") from exc
                    continue
                if type(event) is bytes:
                    piece = event
                    raw_size += len(piece)
                    if decoder is not None:
                        piece = decoder.decompress(piece, min(step, max_body - size + 1))
                        if sink is not None and len(piece) >= step:
                            truncated = True  # one read inflating past a step: cut, never held whole
                    if truncated or size + len(piece) > max_body or raw_size > max_body:
                        piece = piece[: max_body - size]
                        if sink is None:
                            chunks.append(piece)
                        else:
                            await sink.write(piece)
                        truncated = True
                        break
                    size += len(piece)
                    if sink is None:
                        chunks.append(piece)
                    elif not await sink.write(piece):
                        truncated = True
                        break
                elif type(event) is h1.Head:
                    head = event
                    if sink is not None and not sink.head(event.status, list(event.headers)):
                        truncated = True  # the sink wants no body: stop reading, drop the connection
                        break
                    encoding = _header(event.headers, "content-encoding")
                    if encoding is not None:
                        decoder = make_decoder(encoding)
                else:  # h1.END
                    if decoder is not None:
                        tail = decoder.flush(max_body - size + 1)
                        if size + len(tail) > max_body:
                            tail = tail[: max_body - size]
                            truncated = True
                        if sink is None:
                            chunks.append(tail)
                        elif tail:
                            await sink.write(tail)
                    break
        except StreamRefused as exc:
            if not received or head is None:
                raise _StaleConnection from exc
            raise HttpProtocolError(f"{url}: {exc}") from exc
        except h1.HeadTooLarge as exc:
            raise ResponseTooLarge(f"{url}: {exc}") from exc
        except h1.RemoteProtocolError as exc:
            raise HttpProtocolError(f"{url}: malformed HTTP response: {exc}") from exc
        except DecodeError as exc:
            raise CorruptBody(f"{url}: {exc}") from exc
        assert head is not None
        return head, b"".join(chunks), truncated, h.reusable


def _absolute(key: OriginKey, target: str) -> str:
    """The absolute-form target of a request to an HTTP proxy."""
    scheme, host, port = key
    authority = f"[{host}]" if ":" in host else host
    if port != _DEFAULT_PORTS[scheme]:
        authority += f":{port}"
    return f"{scheme}://{authority}{target}"


def _tls_error(exc: ssl.SSLError) -> type[TlsFailed]:
    """The kind of a TLS failure, as the metrics count it."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsCertificateFailed
    reason = (exc.reason or "").upper()
    if "VERSION" in reason or reason == "UNSUPPORTED_PROTOCOL" or "NO_PROTOCOLS_AVAILABLE" in reason:
        return TlsVersionFailed
    return TlsFailed


def _tls_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate not trusted ({exc.verify_message})"
    return str(exc.reason or exc)


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    for n, v in headers:
        if n == name:
            return v
    return None


def _split_url(url: str) -> tuple[str, str, int, str, str]:
    """(scheme, host, port, request target, Host header) of an http(s) URL; raises FetchError.

    The crawler asks for normalized URLs ("http://host[:port]/path?query", printable ASCII): their origin is
    split once and remembered, and their target is the rest as it stands. Anything else takes the general
    path (`urlsplit`)."""
    slash = url.find("/", 8)
    if slash > 0 and (url.startswith("http://") or url.startswith("https://")):
        origin, target = url[:slash], url[slash:]
        if target.isascii() and target.isprintable() and " " not in target and "#" not in target:
            split = _split_origin(origin)
            if split is not None:
                scheme, host, port, host_header = split
                return scheme, host, port, target, host_header
    return _split_any(url)


@lru_cache(maxsize=4096)
def _split_origin(origin: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, Host header) of a plain "scheme://host[:port]", or None for any other shape."""
    if not origin.isascii() or not origin.isprintable() or any(c in origin for c in " ?#@\\[]"):
        return None
    try:
        scheme, host, port, _target, host_header = _split_any(origin + "/")
    except FetchError:
        return None
    return scheme, host, port, host_header


def _split_any(url: str) -> tuple[str, str, int, str, str]:
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise InvalidUrl(f"{url}: not a valid URL: {exc}") from None
    scheme = parts.scheme
    default = _DEFAULT_PORTS.get(scheme)
    if default is None:
        raise InvalidUrl(f"{url}: only http and https URLs can be fetched")
    if not host:
        raise InvalidUrl(f"{url}: the URL has no host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidUrl(f"{url}: the host is not a valid name") from None
    port = port or default
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    if not target.isascii() or " " in target:
        target = quote(target, safe=_SAFE_TARGET)
    host_header = f"[{host}]" if ":" in host else host
    if port != default:
        host_header += f":{port}"
    return scheme, host, port, target, host_header


# Most specific first: the first class the error is an instance of gives httpx's exception.
_HTTPX_ERRORS: tuple[tuple[type[FetchError], type[httpx.TransportError]], ...] = (
    (InvalidUrl, httpx.UnsupportedProtocol),
    (ConnectTimeout, httpx.ConnectTimeout),
    (ReadTimeout, httpx.ReadTimeout),
    (FetchTimeout, httpx.ReadTimeout),
    (HttpProtocolError, httpx.RemoteProtocolError),
    (ResolveFailed, httpx.ConnectError),
    (AddressRefused, httpx.ConnectError),
    (ConnectFailed, httpx.ConnectError),
    (TlsFailed, httpx.ConnectError),
)
_NOT_TO_HTTPX = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})
_HTTPX_DEFAULT_UA = f"python-httpx/{httpx.__version__}"


class HttpxTransport(httpx.AsyncBaseTransport):
    """An httpx transport over a Fetcher: httpx's client API on the node's pool, DNS and limits.

    The body arrives decoded (Content-Encoding is removed from the headers httpx sees); a body cut at
    ``max_body`` is marked by the response extension ``"peercrawl.truncated"``. httpx's own default
    User-Agent is replaced by the fetcher's. The fetcher's timeouts apply, not httpx's.
    """

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        headers = [
            (name, value)
            for name, value in request.headers.multi_items()
            if not (name == "user-agent" and value == _HTTPX_DEFAULT_UA) and name != "accept-encoding"
        ]
        try:
            result = await self._fetcher.request(request.method, str(request.url), headers=headers, content=content)
        except FetchError as exc:
            error = next((theirs for ours, theirs in _HTTPX_ERRORS if isinstance(exc, ours)), httpx.TransportError)
            raise error(str(exc), request=request) from exc
        response_headers = [(n, v) for n, v in result.headers if n.encode("latin-1") not in _NOT_TO_HTTPX]
        response_headers.append(("content-length", str(len(result.body))))
        return httpx.Response(
            result.status,
            headers=response_headers,
            content=result.body,
            extensions={
                "http_version": b"HTTP/2" if result.protocol == "h2" else b"HTTP/1.1",
                "reason_phrase": result.reason.encode("latin-1"),
                "peercrawl.truncated": result.truncated,
                "peercrawl.ip": result.ip,
            },
        )
