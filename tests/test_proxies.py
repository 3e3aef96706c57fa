"""Proxies: the pool's rotation and rest (pure), the handshakes against scripted servers over memory streams,
and the fetcher through real proxies on loopback (Debian's tinyproxy for HTTP proxying and CONNECT, dante for
SOCKS5), the address checks holding whatever the proxy."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio
import trio.testing

from peer.fetch.errors import AddressRefused, ConnectFailed, FetchError, ProxyFailed, RefusedAddress
from peer.fetch.http import Fetcher
from peer.fetch.policy import HostPolicies
from peer.fetch.proxies import ProxyError, ProxyPool, ProxyRefused, http_connect, parse_proxy, socks5_connect
from tests.support.h2web import PAGE as H2_PAGE
from tests.support.h2web import serve_h2web
from tests.support.realproxies import dante, tinyproxy
from tests.support.testca import CertAuthority, make_ca
from tests.test_http import PAGE, start_web

UA = "peercrawl-test/1 (+http://127.0.0.1/contact)"


class Resolver:
    """Every name is 127.0.0.1 except those the test refuses, as the node's resolver refuses private ones."""

    def __init__(self, refused: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.refused = refused
        self.asked: list[str] = []

    async def resolve(self, host: str) -> str:
        self.asked.append(host)
        await trio.lowlevel.checkpoint()
        if host in self.refused:
            raise RefusedAddress(f"{host}: resolves to 10.0.0.1 (private)")
        return "127.0.0.1"


def test_proxy_urls_and_credentials() -> None:
    proxy = parse_proxy("http://bob:s%40cret@proxy.example:8080")
    assert (proxy.scheme, proxy.host, proxy.port, proxy.username, proxy.password) == (
        "http", "proxy.example", 8080, "bob", "s@cret")
    assert "s@cret" not in repr(proxy) and proxy.url == "http://proxy.example:8080"
    assert parse_proxy("socks5h://127.0.0.1", ("alice", "pw")).username == "alice"
    assert parse_proxy("socks5://[::1]").port == 1080 and parse_proxy("socks5h://h").remote_dns
    for bad in ("ftp://h:21", "http://", "http://h:3128/path"):
        with pytest.raises(ValueError):
            parse_proxy(bad)


def test_pool_rotates_and_rests_failing_proxies() -> None:
    a, b, c = (parse_proxy(f"http://10.0.0.{i}:3128") for i in (1, 2, 3))
    pool = ProxyPool([a, b, c], retry_after=30.0)
    assert [pool.choose(0.0) for _ in range(4)] == [a, b, c, a]
    pool.failed(b, 1.0)
    assert [pool.choose(2.0) for _ in range(4)] == [c, a, c, a]  # b rests until 31
    assert pool.choose(31.0) is b  # rested long enough: its turn again
    for proxy in (a, b, c):
        pool.failed(proxy, 40.0 + (proxy is a))
    assert pool.choose(50.0) is b and not pool.any_healthy(50.0)  # all rest: the one resting longest
    assert [s["failures"] for s in pool.status(50.0)] == [1, 2, 1]


async def _scripted(reply: bytes, script) -> tuple[bytes, BaseException | None]:  # type: ignore[no-untyped-def]
    client, server = trio.testing.memory_stream_pair()
    sent = bytearray()
    error: BaseException | None = None

    async def serve() -> None:
        await server.send_all(reply)
        while True:
            data = await server.receive_some(4096)
            if not data:
                return
            sent.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            await script(client)
        except (ProxyError, ProxyRefused) as exc:
            error = exc
        await client.aclose()
    return bytes(sent), error


async def test_connect_handshake_names_the_checked_address() -> None:
    proxy = parse_proxy("http://bob:pw@127.0.0.1:3128")
    sent, error = await _scripted(b"HTTP/1.1 200 Connection established\r\n\r\n",
                                  lambda s: http_connect(s, proxy, "93.184.216.34", 443))
    assert error is None
    assert sent.startswith(b"CONNECT 93.184.216.34:443 HTTP/1.1\r\nHost: 93.184.216.34:443\r\n")
    assert b"Proxy-Authorization: Basic Ym9iOnB3\r\n" in sent
    _, refused = await _scripted(b"HTTP/1.1 403 Forbidden\r\n\r\n", lambda s: http_connect(s, proxy, "::1", 80))
    assert isinstance(refused, ProxyRefused) and "403" in str(refused)
    _, garbage = await _scripted(b"SSH-2.0-OpenSSH\r\n\r\n", lambda s: http_connect(s, proxy, "1.2.3.4", 80))
    assert isinstance(garbage, ProxyError)


async def test_socks5_handshake_address_or_name_and_credentials() -> None:
    reply_ok = b"\x05\x00" + b"\x05\x00\x00\x01" + bytes(6)
    sent, error = await _scripted(reply_ok, lambda s: socks5_connect(s, parse_proxy("socks5://p"), "1.2.3.4", 443))
    assert error is None and sent == b"\x05\x01\x00" + b"\x05\x01\x00\x01\x01\x02\x03\x04\x01\xbb"
    sent, error = await _scripted(reply_ok, lambda s: socks5_connect(s, parse_proxy("socks5h://p"), "a.example", 80))
    assert error is None and sent.endswith(b"\x05\x01\x00\x03\x09a.example\x00\x50")
    with_auth = b"\x05\x02" + b"\x01\x00" + b"\x05\x00\x00\x01" + bytes(6)
    sent, error = await _scripted(with_auth, lambda s: socks5_connect(s, parse_proxy("socks5://u:pw@p"), "1.2.3.4", 80))
    assert error is None and b"\x01\x01u\x02pw" in sent
    refused = b"\x05\x00" + b"\x05\x05\x00\x01" + bytes(6)
    _, error = await _scripted(refused, lambda s: socks5_connect(s, parse_proxy("socks5://p"), "1.2.3.4", 80))
    assert isinstance(error, ProxyRefused) and "connection refused" in str(error)
    _, error = await _scripted(b"\x04\x5a", lambda s: socks5_connect(s, parse_proxy("socks5://p"), "1.2.3.4", 80))
    assert isinstance(error, ProxyError)


# ------------------------------------------------------------------------------------------ real proxies


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertAuthority:
    return make_ca(tmp_path_factory.mktemp("ca"), ["localhost", "secure.test"])


def _policies(ca: CertAuthority, proxy: list[str], rules: list[tuple[str, dict[str, object]]] | None = None,
              retry: float = 30.0) -> HostPolicies:
    return HostPolicies.build(http2=True, proxy=proxy, tls={"tls_ca_file": str(ca.ca_file)}, hosts=rules or [],
                              proxy_retry=retry)


@pytest.mark.slow
async def test_through_tinyproxy_http_proxying_and_connect(tmp_path: Path, nursery: trio.Nursery,
                                                           ca: CertAuthority) -> None:
    """Plain HTTP goes as absolute-form requests to the proxy (which adds Via); HTTPS goes through a CONNECT
    tunnel to the checked address, and HTTP/2 works inside it. Credentials come with every request."""
    web = await start_web(nursery)
    h2web = await nursery.start(functools.partial(serve_h2web, ca.server_context(), h2_only=True))
    with tinyproxy(tmp_path, user="bob", password="s3cret") as proxy:
        good = _policies(ca, [f"http://bob:s3cret@127.0.0.1:{proxy.port}"])
        async with Fetcher(Resolver(), user_agent=UA, policies=good) as fetcher:
            # plain HTTP proxying names the host (the proxy resolves it again): a name tinyproxy can resolve
            plain = await fetcher.fetch(web.url("/page", host="localhost"))
            again = await fetcher.fetch(web.url("/page?enc=gzip", host="localhost"))
            tls = await fetcher.fetch(f"https://secure.test:{h2web.port}/x")
        bad = _policies(ca, [f"http://bob:wrong@127.0.0.1:{proxy.port}"])
        async with Fetcher(Resolver(), user_agent=UA, policies=bad) as fetcher:
            with pytest.raises(ConnectFailed) as refused:
                await fetcher.fetch(f"https://secure.test:{h2web.port}/y")
        log = proxy.log_text()
    assert plain.body == PAGE and again.body == PAGE
    assert "tinyproxy" in web.requests[0][2].get("via", "")  # it went through the proxy
    assert all("proxy-authorization" not in {k.lower() for k, _ in r.request_headers} for r in (plain, tls))
    assert tls.protocol == "h2" and tls.body == H2_PAGE
    assert f"CONNECT 127.0.0.1:{h2web.port}" in log  # the address the node checked, not the name
    # tinyproxy answers 401 where RFC 9110 says 407; either way the proxy works and is not rested
    assert "401" in str(refused.value) and not isinstance(refused.value, ProxyFailed)


@pytest.mark.slow
async def test_through_dante_socks5_and_socks5h(tmp_path: Path, nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start_web(nursery)
    h2web = await nursery.start(functools.partial(serve_h2web, ca.server_context(), h2_only=True))
    with dante(tmp_path) as proxy:
        socks = _policies(ca, [f"socks5://127.0.0.1:{proxy.port}"],
                          rules=[("localhost", {"proxy": f"socks5h://127.0.0.1:{proxy.port}"})])
        resolver = Resolver()
        async with Fetcher(resolver, user_agent=UA, policies=socks) as fetcher:
            plain = await fetcher.fetch(web.url("/page", host="site.test"))
            tls = await fetcher.fetch(f"https://secure.test:{h2web.port}/x")
            by_name = await fetcher.fetch(f"https://localhost:{h2web.port}/z")
        log = proxy.log_text()
    assert plain.body == PAGE and tls.body == H2_PAGE and by_name.body == H2_PAGE and by_name.protocol == "h2"
    assert "localhost" in resolver.asked  # socks5h too: the node checks the name before the proxy resolves it
    assert f"127.0.0.1.{h2web.port}" in log and f"127.0.0.1.{web.port}" in log  # dante logged both tunnels


@pytest.mark.slow
async def test_a_proxy_is_no_way_around_the_address_checks(tmp_path: Path, nursery: trio.Nursery,
                                                           ca: CertAuthority) -> None:
    """A name the node's resolver refuses is refused before any proxy is asked, for every kind of proxy."""
    web = await start_web(nursery)
    with tinyproxy(tmp_path) as http_proxy, dante(tmp_path) as socks:
        for url in (f"http://127.0.0.1:{http_proxy.port}", f"socks5://127.0.0.1:{socks.port}",
                    f"socks5h://127.0.0.1:{socks.port}"):
            policies = _policies(ca, [url])
            async with Fetcher(Resolver(refused={"intranet.test"}), user_agent=UA, policies=policies) as fetcher:
                for target in (web.url("/page", host="intranet.test"), "https://intranet.test/"):
                    with pytest.raises(AddressRefused):
                        await fetcher.fetch(target)
            assert policies.default.proxies is not None and policies.default.proxies.proxies[0].uses == 0
        assert "intranet" not in http_proxy.log_text() and "intranet" not in socks.log_text()
    assert all(host != "intranet.test" for host, _, _ in web.requests)


@pytest.mark.slow
async def test_a_dead_proxy_rests_while_the_others_serve(tmp_path: Path, nursery: trio.Nursery,
                                                         ca: CertAuthority) -> None:
    web = await start_web(nursery)
    with tinyproxy(tmp_path) as live:
        dead = parse_proxy("http://127.0.0.1:1")  # nothing listens on port 1
        policies = _policies(ca, [dead.url, f"http://127.0.0.1:{live.port}"], retry=3600)
        pool = policies.default.proxies
        assert pool is not None
        async with Fetcher(Resolver(), user_agent=UA, policies=policies, max_idle_per_origin=0) as fetcher:
            for i in range(4):
                assert (await fetcher.fetch(web.url(f"/page?n={i}", host="localhost"))).body == PAGE
        dead_state, live_state = pool.proxies
        assert (dead_state.failures, dead_state.uses) == (1, 1)  # tried once, then rested
        assert live_state.uses == 4 and live_state.failures == 0
        only_dead = _policies(ca, [dead.url])
        async with Fetcher(Resolver(), user_agent=UA, policies=only_dead) as fetcher:
            with pytest.raises(ProxyFailed) as failed:
                await fetcher.fetch(web.url("/page", host="localhost"))
        assert failed.value.label == "proxy" and isinstance(failed.value, FetchError)
