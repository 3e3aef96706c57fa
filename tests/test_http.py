"""The fetcher against a real trio h11 server on loopback that counts connections and misbehaves on request."""

from __future__ import annotations

import datetime
import functools
import gzip
import os
import resource
import socket
import ssl
import tempfile
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import brotli
import h11
import httpx
import pytest
import trio
import trio.testing

from peer.fetch.dns import CachingResolver
from peer.fetch.errors import (
    AddressRefused,
    ConnectFailed,
    CorruptBody,
    DnsError,
    FetchError,
    FetchTimeout,
    HttpProtocolError,
    InvalidUrl,
    NxDomain,
    ReadTimeout,
    RefusedAddress,
    ResolveFailed,
    ResponseTooLarge,
    TlsCertificateFailed,
    TlsFailed,
)
from peer.fetch.http import Fetcher, HttpxTransport
from peer.fetch.pool import MAX_IDLE_TOTAL, default_max_idle_total
from peerlab.localweb.dns_server import serve_dns

UA = "peercrawl-test/1 (+http://127.0.0.1/contact)"
PAGE = b"<html><body>" + b"".join(b"<a href='/p%d'>link %d</a>\n" % (i, i) for i in range(600)) + b"</body></html>"


@pytest.fixture
def clock() -> trio.testing.MockClock:
    # Jump virtual time only after 20 ms of real idleness, so loopback traffic is never outrun by the clock.
    return trio.testing.MockClock(autojump_threshold=0.02)


class StaticResolver:
    """Every name is 127.0.0.1, except those mapped to a DNS error class."""

    def __init__(self, failing: dict[str, type[DnsError]] | None = None) -> None:
        self.failing = failing or {}
        self.calls = 0

    async def resolve(self, host: str) -> str:
        self.calls += 1
        await trio.lowlevel.checkpoint()
        if host in self.failing:
            raise self.failing[host](f"{host}: test failure")
        return "127.0.0.1"


@dataclass
class LocalWeb:
    """Counts connections (per Host, concurrent) and serves routes chosen by path."""

    port: int = 0
    connections: int = 0
    closed: int = 0
    active: Counter[str] = field(default_factory=Counter)
    max_active: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def url(self, path: str, host: str = "site.test") -> str:
        return f"http://{host}:{self.port}{path}"

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        host = None
        drop_next = False
        try:
            while True:
                event = await _next(conn, stream)
                if not isinstance(event, h11.Request) or drop_next:
                    return
                headers = {k.decode(): v.decode() for k, v in event.headers}
                if host is None:
                    host = headers.get("host", "").split(":")[0]
                    self.active[host] += 1
                    self.max_active[host] = max(self.max_active[host], self.active[host])
                target = event.target.decode()
                self.requests.append((host, target, headers))
                drop_next = target == "/drop-next"
                while not isinstance(await _next(conn, stream), h11.EndOfMessage):
                    pass
                if not await self.route(conn, stream, target):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return
        finally:
            if host is not None:
                self.active[host] -= 1
            self.closed += 1
            await stream.aclose()

    async def route(self, conn: h11.Connection, stream: trio.SocketStream, target: str) -> bool:
        """Answer one request; False closes the connection."""
        parts = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        path = parts.path

        async def respond(status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            await stream.send_all(data)

        if path == "/page":
            body, headers = PAGE, [("content-type", "text/html; charset=utf-8")]
            encoding = query.get("enc")
            if encoding:
                body = {
                    "gzip": gzip.compress,
                    "deflate": zlib.compress,
                    "rawdeflate": lambda b: zlib.compress(b)[2:-4],
                    "br": brotli.compress,
                }[encoding](PAGE)
                headers.append(("content-encoding", "deflate" if encoding == "rawdeflate" else encoding))
            await trio.sleep(float(query.get("sleep", 0)))
            await respond(200, [*headers, ("content-length", str(len(body)))], body)
        elif path == "/chunked":
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])))
            for i in range(0, len(PAGE), 1000):
                await stream.send_all(conn.send(h11.Data(data=PAGE[i : i + 1000])))
            await stream.send_all(conn.send(h11.EndOfMessage()))
        elif path == "/huge":  # streams until the client goes away
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])))
            block = b"x" * 65536
            for _ in range(10_000):  # 640 MiB at most
                await stream.send_all(conn.send(h11.Data(data=block)))
            return False
        elif path == "/bomb":
            body = gzip.compress(b"\0" * (8 * 2**20))
            await respond(200, [("content-encoding", "gzip"), ("content-length", str(len(body)))], body)
        elif path == "/slow":
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[("content-length", "10")])))
            await trio.sleep(1000)
            return False
        elif path == "/drip":
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[("content-length", "1000")])))
            for _ in range(1000):
                await trio.sleep(1.0)
                await stream.send_all(conn.send(h11.Data(data=b"x")))
            return False
        elif path == "/malformed":
            await stream.send_all(b"HTTP/1.1 two hundred OK\r\nContent-Length: 2\r\n\r\nhi")
            return False
        elif path == "/bigheaders":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
            return False
        elif path == "/badgzip":
            await respond(200, [("content-encoding", "gzip"), ("content-length", "19")], b"not gzip at all....")
        elif path == "/redirect":
            await respond(301, [("location", "/page"), ("content-length", "0")])
        elif path == "/then-close":  # keep-alive response, then the server drops the connection anyway
            await respond(200, [("content-length", "2")], b"ok")
            return False
        elif path in ("/echo", "/drop-next"):
            await respond(200, [("content-length", "2")], b"ok")
        else:
            await respond(404, [("content-length", "0")])
        return True


async def _next(conn: h11.Connection, stream: trio.SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))


async def start_web(nursery: trio.Nursery) -> LocalWeb:
    web = LocalWeb()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, web.handle, 0, host="127.0.0.1"))
    web.port = listeners[0].socket.getsockname()[1]
    return web


@pytest.fixture
async def web(nursery: trio.Nursery) -> AsyncIterator[LocalWeb]:
    yield await start_web(nursery)


async def test_keep_alive_reuses_one_connection(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        for _ in range(5):
            response = await fetcher.fetch(web.url("/page"))
            assert response.status == 200 and response.reason == "OK" and response.body == PAGE
        assert web.connections == 1 and len(web.requests) == 5
        assert fetcher.pool.idle_count == 1
    assert response.ip == "127.0.0.1" and not response.truncated and response.elapsed >= 0
    assert response.url == web.url("/page")
    assert ("content-type", "text/html; charset=utf-8") in response.headers
    sent = dict(response.request_headers)
    assert sent["host"] == f"site.test:{web.port}" and sent["user-agent"] == UA
    assert sent["accept-encoding"] == "gzip, deflate, br"
    assert web.requests[0][2]["user-agent"] == UA
    await trio.testing.wait_all_tasks_blocked()
    assert web.closed == 1  # leaving the fetcher closed the idle connection


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "rawdeflate", "br"])
async def test_content_encodings_are_decoded(web: LocalWeb, encoding: str) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        response = await fetcher.fetch(web.url(f"/page?enc={encoding}"))
    assert response.body == PAGE and not response.truncated
    assert dict(response.headers)["content-encoding"] == ("deflate" if encoding == "rawdeflate" else encoding)


async def test_chunked_encoding(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        response = await fetcher.fetch(web.url("/chunked"))
        again = await fetcher.fetch(web.url("/chunked"))
    assert response.body == PAGE and again.body == PAGE
    assert web.connections == 1


async def test_endless_body_is_cut_at_max_body(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, max_body=1_000_000, total_timeout=20.0) as fetcher:
        response = await fetcher.fetch(web.url("/huge"))  # total_timeout bounds the test if the cut failed
        assert response.truncated and len(response.body) == 1_000_000 and set(response.body) == {ord("x")}
        assert fetcher.pool.idle_count == 0  # that connection was closed, not kept
        assert (await fetcher.fetch(web.url("/page"))).body == PAGE
    assert web.connections == 2


async def test_decompression_bomb_is_cut_at_max_body(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, max_body=100_000) as fetcher:
        response = await fetcher.fetch(web.url("/bomb"))
    assert response.truncated and response.body == b"\0" * 100_000


async def test_slow_server_read_timeout(web: LocalWeb, clock: trio.testing.MockClock) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, read_timeout=7.0, total_timeout=60.0) as fetcher:
        start = trio.current_time()
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(web.url("/slow"))
    assert type(info.value) is ReadTimeout and info.value.label == "timeout" and "7 s" in str(info.value)
    assert trio.current_time() - start == 7.0


async def test_drip_feeding_server_total_timeout(web: LocalWeb, clock: trio.testing.MockClock) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, read_timeout=5.0, total_timeout=10.5) as fetcher:
        start = trio.current_time()
        with pytest.raises(FetchError) as info:
            await fetcher.fetch(web.url("/drip"))
    assert type(info.value) is FetchTimeout and info.value.label == "timeout" and "10.5 s" in str(info.value)
    assert trio.current_time() - start == 10.5


async def test_malformed_response_is_a_protocol_error(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        for path, error, label in [
            ("/malformed", HttpProtocolError, "protocol"),
            ("/badgzip", CorruptBody, "protocol"),
            ("/bigheaders", ResponseTooLarge, "too-large"),
        ]:
            with pytest.raises(HttpProtocolError) as info:
                await fetcher.fetch(web.url(path))
            assert type(info.value) is error and info.value.label == label, path
            assert "\n" not in str(info.value)
        assert fetcher.pool.idle_count == 0


async def test_connection_refused() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
    port = holder.getsockname()[1]
    try:
        async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
            with pytest.raises(FetchError) as info:
                await fetcher.fetch(f"http://site.test:{port}/")
        assert type(info.value) is ConnectFailed and info.value.label == "connect"
        assert f"127.0.0.1:{port}" in str(info.value)
    finally:
        holder.close()


async def test_one_connection_per_origin(web: LocalWeb, nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    dns_server = await nursery.start(lambda task_status: serve_dns({"*.test": "127.0.0.1"}, task_status=task_status))
    resolver = CachingResolver([f"127.0.0.1:{dns_server.address[1]}"], allow_private=True)
    async with Fetcher(resolver, user_agent=UA) as fetcher, trio.open_nursery() as inner:
        for i in range(12):
            inner.start_soon(fetcher.fetch, web.url("/page?sleep=1", host=f"h{i % 3}.test"))
    assert web.max_active == Counter({"h0.test": 1, "h1.test": 1, "h2.test": 1})
    assert web.connections == 3 and len(web.requests) == 12
    assert trio.current_time() == 4.0  # three hosts in parallel, four requests each in turn
    assert resolver.stats.queries == 3


async def test_more_connections_per_origin_when_allowed(web: LocalWeb, clock: trio.testing.MockClock) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, max_connections_per_origin=3, max_idle_per_origin=3) as f:
        async with trio.open_nursery() as inner:
            for _ in range(6):
                inner.start_soon(f.fetch, web.url("/page?sleep=1"))
        assert f.pool.idle_count == 3
    assert web.max_active["site.test"] == 3 and web.connections == 3
    assert trio.current_time() == 2.0


async def test_dns_failures_become_fetch_errors(web: LocalWeb) -> None:
    resolver = StaticResolver({"gone.test": NxDomain, "lan.test": RefusedAddress})
    async with Fetcher(resolver, user_agent=UA) as fetcher:
        for host, error, label in [("gone.test", ResolveFailed, "dns"), ("lan.test", AddressRefused, "refused-address")]:
            with pytest.raises(FetchError) as info:
                await fetcher.fetch(web.url("/page", host=host))
            assert type(info.value) is error and info.value.label == label
            assert isinstance(info.value.__cause__, DnsError)
    assert web.connections == 0


async def test_stale_keep_alive_connection_is_retried(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        assert (await fetcher.fetch(web.url("/then-close"))).body == b"ok"
        await trio.testing.wait_all_tasks_blocked()
        assert (await fetcher.fetch(web.url("/echo"))).body == b"ok"
    assert web.connections == 2


async def test_request_on_a_connection_the_server_drops_is_retried(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        assert (await fetcher.fetch(web.url("/drop-next"))).body == b"ok"
        # The kept connection looks alive, but the server closes it on the next request without answering.
        assert (await fetcher.fetch(web.url("/echo"))).body == b"ok"
    assert web.connections == 2
    assert [t for _, t, _ in web.requests] == ["/drop-next", "/echo"]


async def test_idle_connections_expire(web: LocalWeb, clock: trio.testing.MockClock) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA, idle_timeout=30.0) as fetcher:
        await fetcher.fetch(web.url("/echo"))
        assert fetcher.pool.idle_count == 1
        await trio.sleep(29.0)
        await fetcher.fetch(web.url("/echo", host="other.test"))  # 29 s idle: site.test's connection stays
        assert fetcher.pool.idle_count == 2 and web.connections == 2
        await trio.sleep(29.0)
        # Using the pool expires what has been idle too long: site.test's after 58 s, not other.test's.
        await fetcher.fetch(web.url("/echo", host="third.test"))
        assert fetcher.pool.idle_count == 2 and fetcher.pool.origin_count == 2
        await fetcher.fetch(web.url("/echo"))  # a new connection: the old one was closed
        assert web.connections == 4
    assert fetcher.pool.idle_count == 0 and fetcher.pool.origin_count == 0


async def test_redirects_are_returned_not_followed(web: LocalWeb) -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        response = await fetcher.fetch(web.url("/redirect"), headers=[("User-Agent", "other/2"), ("X-Hop", "1")])
    assert response.status == 301 and dict(response.headers)["location"] == "/page"
    assert [target for _, target, _ in web.requests] == ["/redirect"]
    sent = web.requests[0][2]
    assert sent["user-agent"] == "other/2" and sent["x-hop"] == "1"
    assert [n.lower() for n, _ in response.request_headers].count("user-agent") == 1


async def test_bad_urls() -> None:
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:
        for url in ("ftp://site.test/", "http:///nohost", "http://site.test:99999/"):
            with pytest.raises(FetchError) as info:
                await fetcher.fetch(url)
            assert type(info.value) is InvalidUrl and info.value.label == "protocol", url


async def test_httpx_client_over_the_transport(web: LocalWeb) -> None:
    async with (
        Fetcher(StaticResolver({"lan.test": RefusedAddress}), user_agent=UA) as fetcher,
        httpx.AsyncClient(transport=HttpxTransport(fetcher)) as client,
    ):
        response = await client.get(web.url("/page?enc=gzip"), headers={"X-Trace": "7"})
        assert response.status_code == 200 and response.content == PAGE
        assert "content-encoding" not in response.headers
        assert response.text.startswith("<html>")
        assert response.extensions["peercrawl.truncated"] is False
        posted = await client.post(web.url("/echo"), content=b"payload")
        assert posted.status_code == 200 and posted.text == "ok"
        with pytest.raises(httpx.ConnectError):
            await client.get(web.url("/page", host="lan.test"))
    sent = web.requests[0][2]
    assert sent["user-agent"] == UA and sent["x-trace"] == "7"
    assert web.requests[1][2]["content-length"] == "7"
    assert web.connections == 1


def make_tls_contexts(hostname: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A throwaway CA and a certificate for ``hostname``: (server context, client context trusting the CA)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    validity = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool):  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0])
            .not_valid_after(validity[1])
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("peercrawl test CA", ca_key, "peercrawl test CA", ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = certificate(hostname, leaf_key, "peercrawl test CA", ca_key, ca=False)
    pem = serialization.Encoding.PEM
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        with open(cert_path, "wb") as f:
            f.write(leaf_cert.public_bytes(pem))
        with open(key_path, "wb") as f:
            f.write(
                leaf_key.private_bytes(
                    pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        server.load_cert_chain(cert_path, key_path)
    client = ssl.create_default_context(cadata=ca_cert.public_bytes(pem).decode())
    return server, client


async def test_https_with_sni_and_certificate_checks(nursery: trio.Nursery) -> None:
    server_ctx, client_ctx = make_tls_contexts("secure.test")
    web = LocalWeb()
    listeners = await nursery.start(
        functools.partial(trio.serve_ssl_over_tcp, web.handle, 0, server_ctx, host="127.0.0.1")
    )
    web.port = listeners[0].transport_listener.socket.getsockname()[1]
    url = f"https://secure.test:{web.port}/page?enc=br"
    async with Fetcher(StaticResolver(), user_agent=UA, ssl_context=client_ctx) as fetcher:
        first = await fetcher.fetch(url)
        second = await fetcher.fetch(url)
    assert first.body == PAGE and second.body == PAGE and web.connections == 1
    assert web.requests[0][2]["host"] == f"secure.test:{web.port}"
    async with Fetcher(StaticResolver(), user_agent=UA, ssl_context=client_ctx) as fetcher:
        with pytest.raises(FetchError) as wrong_name:  # the certificate names secure.test only
            await fetcher.fetch(f"https://other.test:{web.port}/page")
    # counted by kind: a certificate for another name is a certificate failure
    assert isinstance(wrong_name.value, TlsFailed) and wrong_name.value.label == "tls-certificate"
    assert "\n" not in str(wrong_name.value)
    async with Fetcher(StaticResolver(), user_agent=UA) as fetcher:  # system CAs: our test CA is unknown
        with pytest.raises(FetchError) as untrusted:
            await fetcher.fetch(url)
    assert type(untrusted.value) is TlsCertificateFailed


def test_idle_connections_kept_scale_with_the_descriptor_limit() -> None:
    """A quarter of the descriptor limit (at least 8, at most 16,384): a crawl rotating over more hosts than
    1,024 keeps their connections when the limit allows it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        for limit in (20, 1024, 20_000, 200_000):
            if hard != resource.RLIM_INFINITY and limit > hard:
                continue
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            assert default_max_idle_total() == max(8, min(MAX_IDLE_TOTAL, limit // 4))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert default_max_idle_total() > 1024 or soft // 4 <= 1024
