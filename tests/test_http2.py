"""HTTP/2 by ALPN: the fetcher against a real h2 server over TLS on loopback (tests/support/h2web.py), well
behaved and hostile, and the per-host switch."""

from __future__ import annotations

import functools
import resource
from pathlib import Path

import pytest
import trio

from peer.fetch.errors import FetchError, HttpProtocolError, ResponseTooLarge
from peer.fetch.http import Fetcher, HttpxTransport
from peer.fetch.policy import HostPolicies, HostPolicy, TlsPolicy
from tests.support.h2web import BIG, PAGE, H2Web, serve_h2web
from tests.support.testca import CertAuthority, make_ca

UA = "peercrawl-test/1 (+http://127.0.0.1/contact)"


class LoopbackResolver:
    async def resolve(self, host: str) -> str:
        await trio.lowlevel.checkpoint()
        return "127.0.0.1"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertAuthority:
    return make_ca(tmp_path_factory.mktemp("ca"), ["h2.test", "one.test", "two.test", "old.test"])


async def start(nursery: trio.Nursery, ca: CertAuthority, *, h2_only: bool = False) -> H2Web:
    return await nursery.start(functools.partial(serve_h2web, ca.server_context(), h2_only=h2_only))


def policies(ca: CertAuthority, *, http2: bool = True, rules: list[tuple[str, dict[str, object]]] | None = None,
             ) -> HostPolicies:
    return HostPolicies.build(http2=http2, proxy=(), tls={"tls_ca_file": str(ca.ca_file)}, hosts=rules or [])


async def test_http2_chosen_by_alpn_and_one_connection_reused(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start(nursery, ca, h2_only=True)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        first = await fetcher.fetch(f"https://h2.test:{web.port}/a")
        second = await fetcher.fetch(f"https://h2.test:{web.port}/b?enc=gzip")
        big = await fetcher.fetch(f"https://h2.test:{web.port}/big")
    assert first.protocol == second.protocol == "h2"
    assert first.status == 200 and first.reason == "OK" and first.body == PAGE
    assert second.body == PAGE and ("content-encoding", "gzip") in second.headers
    assert len(big.body) == BIG and not big.truncated  # 3 MiB through a 1 MiB window: flow control works
    assert web.connections == 1
    assert [(h, p, a) for h, p, a in web.log] == [
        (f"h2.test:{web.port}", "/a", "h2"), (f"h2.test:{web.port}", "/b?enc=gzip", "h2"),
        (f"h2.test:{web.port}", "/big", "h2")]
    # the request as sent is kept in its HTTP/1.1 form, Host first, for the WARC request record
    assert first.request_headers[0] == ("host", f"h2.test:{web.port}")


async def test_body_and_decompression_limits_hold_over_http2(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start(nursery, ca, h2_only=True)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca), max_body=100_000) as fetcher:
        cut = await fetcher.fetch(f"https://h2.test:{web.port}/big")
        after = await fetcher.fetch(f"https://h2.test:{web.port}/p")
    assert cut.truncated and len(cut.body) == 100_000
    assert after.body == PAGE and after.protocol == "h2"


async def test_a_decompression_bomb_over_http2_is_cut_at_max_body(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start(nursery, ca, h2_only=True)
    before = _rss_kib()
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        bomb = await fetcher.fetch(f"https://h2.test:{web.port}/bomb")
        after = await fetcher.fetch(f"https://h2.test:{web.port}/p")
    assert bomb.truncated and len(bomb.body) == 10 * 2**20 and after.body == PAGE
    assert _rss_kib() - before < 64 * 1024  # a 256 MiB bomb: the 10 MiB body and bounded buffers


async def test_http2_off_falls_back_to_http11_globally_and_per_host(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start(nursery, ca)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca, http2=False)) as fetcher:
        off = await fetcher.fetch(f"https://one.test:{web.port}/x")
    assert off.protocol == "http/1.1" and off.body == PAGE
    rules = [("two.test", {"http2": "off"})]
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca, rules=rules)) as fetcher:
        on = await fetcher.fetch(f"https://one.test:{web.port}/y")
        per_host = await fetcher.fetch(f"https://two.test:{web.port}/z")
    assert (on.protocol, per_host.protocol) == ("h2", "http/1.1")
    assert [a for _, _, a in web.log] == ["http/1.1", "h2", "http/1.1"]


async def test_an_http2_only_server_needs_http2(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await start(nursery, ca, h2_only=True)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca, http2=False)) as fetcher:
        with pytest.raises(HttpProtocolError):
            await fetcher.fetch(f"https://h2.test:{web.port}/x")
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        assert (await fetcher.fetch(f"https://h2.test:{web.port}/x")).body == PAGE


async def test_httpx_sees_http2(nursery: trio.Nursery, ca: CertAuthority) -> None:
    httpx = pytest.importorskip("httpx")
    web = await start(nursery, ca, h2_only=True)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        async with httpx.AsyncClient(transport=HttpxTransport(fetcher)) as client:
            response = await client.get(f"https://h2.test:{web.port}/q")
    assert response.http_version == "HTTP/2" and response.content == PAGE


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize(("path", "error", "phrase"), [
    ("/settings-flood", HttpProtocolError, "control frames"),
    ("/ping-flood", HttpProtocolError, "control frames"),
    ("/huge-header", ResponseTooLarge, ""),
    ("/endless-continuation", FetchError, ""),
    ("/reset", HttpProtocolError, "reset"),
    ("/goaway", HttpProtocolError, "two connections"),
    ("/refuse", HttpProtocolError, "two connections"),
])
async def test_hostile_http2_servers_fail_one_fetch_within_a_memory_bound(
        nursery: trio.Nursery, ca: CertAuthority, path: str, error: type[FetchError], phrase: str) -> None:
    """A flood of SETTINGS or PING, a 1 MiB header block, CONTINUATION frames without end, a reset or refused
    stream, a GOAWAY: each fails that one fetch (a typed error), the node's memory grows by less than 32 MiB,
    and the fetcher goes on to fetch a good page from the same server."""
    web = await start(nursery, ca, h2_only=True)
    before = _rss_kib()
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca), read_timeout=5,
                       total_timeout=20) as fetcher:
        with pytest.raises(error) as failed:
            await fetcher.fetch(f"https://h2.test:{web.port}{path}")
        good = await fetcher.fetch(f"https://h2.test:{web.port}/after")
    assert phrase in str(failed.value)
    assert good.body == PAGE and good.protocol == "h2"
    assert _rss_kib() - before < 32 * 1024
    if path in ("/settings-flood", "/ping-flood"):
        assert web.sent_frames < 1_000_000  # the fetcher left before the flood was over


def test_tls_policy_builds_contexts_once_per_distinct_policy(tmp_path: Path, ca: CertAuthority) -> None:
    built = HostPolicies.build(http2=True, proxy=(), tls={"tls_ca_file": str(ca.ca_file)}, hosts=[
        ("old.test", {"tls_min_version": "TLSv1.2", "tls_max_version": "TLSv1.2"}),
        ("*.legacy.test", {"tls_verify": False, "http2": False}),
    ])
    assert built.for_host("old.test").tls.max_version == "TLSv1.2"
    assert built.for_host("a.old.test") is built.for_host("old.test")  # a name covers its subdomains
    assert built.for_host("x.legacy.test").http2 is False and built.for_host("legacy.test").http2 is True
    assert built.for_host("x.legacy.test").ssl_context().verify_mode.name == "CERT_NONE"
    assert built.for_host("z.test").ssl_context() is built.for_host("y.test").ssl_context()
    with pytest.raises(ValueError, match="tls_min_version"):
        HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[("a.test", {"tls_min_version": "SSLv3"})])
    with pytest.raises(ValueError, match="unknown setting"):
        HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[("a.test", {"delay": 3})])
    assert TlsPolicy().verify is True and HostPolicy().http2 is True


async def test_http2_exchange_recorded_in_http11_form_with_warc_protocol(
        nursery: trio.Nursery, ca: CertAuthority, tmp_path: Path) -> None:
    """An HTTP/2 exchange is written as HTTP/1.1 request and response records that say `WARC-Protocol: h2`;
    warcio (the reference reader) reads them back whole. An HTTP/1.1 exchange has no such header."""
    from warcio.archiveiterator import ArchiveIterator

    from peer.crawl.responses import as_decoded
    from storage import open_page_store

    web = await start(nursery, ca)
    rules = [("one.test", {"http2": False})]
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca, rules=rules)) as fetcher:
        h2_page = await fetcher.fetch(f"https://h2.test:{web.port}/page?enc=gzip")
        h1_page = await fetcher.fetch(f"https://one.test:{web.port}/page")
    assert (h2_page.protocol, h1_page.protocol) == ("h2", "http/1.1")
    store = open_page_store("warc", tmp_path / "warc")
    for resp in (h2_page, h1_page):
        store.store(url=resp.url, request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
                    response_headers=as_decoded(resp), body=resp.body, ip=resp.ip, fetched_at=1_700_000_000.0,
                    truncated=resp.truncated, protocol=resp.protocol)
    store.close()
    records = []
    for path in sorted((tmp_path / "warc").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                if record.rec_type in ("response", "request"):
                    records.append((record.rec_type, record.rec_headers.get_header("WARC-Target-URI"),
                                    record.rec_headers.get_header("WARC-Protocol"), record.http_headers,
                                    record.content_stream().read()))
    by_key = {(kind, uri): (proto, http, body) for kind, uri, proto, http, body in records}
    proto, http, body = by_key[("response", h2_page.url)]
    assert proto == "h2" and http.protocol == "HTTP/1.1" and http.get_statuscode() == "200" and body == PAGE
    assert http.get_header("content-encoding") is None  # the body is stored decoded
    proto, http, _ = by_key[("request", h2_page.url)]
    assert proto == "h2" and http.protocol == "GET" and http.get_header("host") == f"h2.test:{web.port}"
    proto, http, body = by_key[("response", h1_page.url)]
    assert proto is None and body == PAGE


async def test_a_request_http_cannot_carry_is_refused_before_sending(nursery: trio.Nursery,
                                                                     ca: CertAuthority) -> None:
    web = await start(nursery, ca, h2_only=True)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        for bad in ([("x-a", "line\r\nbreak")], [("bad name", "v")]):
            with pytest.raises(HttpProtocolError, match="cannot send"):
                await fetcher.fetch(f"https://h2.test:{web.port}/x", headers=bad)
        ok = await fetcher.fetch(f"https://h2.test:{web.port}/x", headers=[("X-Mixed-Case", "v")])
    assert ok.protocol == "h2" and [p for _, p, _ in web.log] == ["/x"]
