"""The local web: a deterministic generator, an oracle checked by hand, a server checked over real
loopback sockets against the oracle, and referees that catch impoliteness created on purpose."""

from __future__ import annotations

import gzip
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import h11
import httpx
import lxml.html
import pytest
import trio

from peerlab.localweb.bench import WIDE_WEB, nginx_binary, start_bench_web
from peerlab.localweb.features import MIN_FEATURE_HOSTS
from peerlab.localweb.graph import SiteGraph, loopback_address, page_path
from peerlab.localweb.model import HostSpec, Link, Resource, idna_host, make_url, norm_path
from peerlab.localweb.oracle import TrapGuard
from peerlab.localweb.referee import (
    RequestRecord,
    crawl_delay_violations,
    max_concurrent_connections_per_host,
    read_log,
    requested_paths,
    requested_urls,
)
from peerlab.localweb.render import render
from peerlab.localweb.robots_spec import RobotsGroup, RobotsSpec, Rule
from peerlab.localweb.server import serve_web
from peerlab.localweb.static import write_site

UA = "peercrawl/0.1 (+http://example.invalid/bot)"
ROOT = Path(__file__).resolve().parents[1]


def small_graph(**kw: object) -> SiteGraph:
    args: dict[str, object] = {"seed": 7, "hosts": MIN_FEATURE_HOSTS, "pages_per_host": 4, "links_per_page": 4,
                               "slow_delay": 0.3}
    args.update(kw)
    return SiteGraph.generate(**args)  # type: ignore[arg-type]


# -- a raw HTTP/1.1 client, so the tests control every byte and connection -----------------------------


class RawClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def get(self, host: str, path: str, *, headers: tuple[tuple[str, str], ...] = (), method: str = "GET",
                  limit: int | None = None) -> tuple[int, dict[str, str], bytes]:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        req = h11.Request(method=method, target=path, headers=[("Host", host), ("User-Agent", UA), *headers])
        await self.stream.send_all(self.conn.send(req) + self.conn.send(h11.EndOfMessage()))
        status, hdrs, body = 0, {}, bytearray()
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                hdrs = {k.decode(): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
                if limit is not None and len(body) >= limit:
                    return status, hdrs, bytes(body)
            elif isinstance(event, h11.EndOfMessage):
                return status, hdrs, bytes(body)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def fetch(port: int, url: str, **kw: object) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    client = await RawClient.connect(port)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return await client.get(parts.hostname or "", target, **kw)  # type: ignore[arg-type]
    finally:
        await client.aclose()


# -- the generator ---------------------------------------------------------------------------------------


def _digest(graph: SiteGraph) -> str:
    h = hashlib.sha256()
    for res in graph.iter_resources():
        h.update(repr((res.host, res.path, res.kind, res.status, res.links, res.location)).encode())
        h.update(render(graph, res, 1234).body if res.kind != "huge" else b"huge")
    for spec in graph.hosts:
        h.update(spec.robots.render())
    return h.hexdigest()


@pytest.mark.slow
def test_generator_is_deterministic_for_a_seed_even_across_processes() -> None:
    a, b, c = small_graph(), small_graph(), small_graph(seed=8)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    code = ("from tests.test_localweb import small_graph, _digest; print(_digest(small_graph()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == _digest(a)


def test_generate_rejects_bad_arguments_with_one_clear_line() -> None:
    with pytest.raises(ValueError, match="features=True needs hosts >= 14"):
        SiteGraph.generate(seed=1, hosts=5)
    with pytest.raises(ValueError, match="cross_host_fraction"):
        SiteGraph.generate(seed=1, cross_host_fraction=1.5)


def test_ordinary_pages_link_within_and_across_hosts() -> None:
    graph = SiteGraph.generate(seed=2, hosts=20, pages_per_host=10, links_per_page=10, features=False)
    same = cross = 0
    for res in graph.iter_resources():
        assert len(res.links) == 10
        for link in res.links:
            assert graph.resource(link.host, link.path) is not None
            same += link.host == res.host
            cross += link.host != res.host
    assert same > 0 and cross > 0
    assert 0.2 < cross / (same + cross) < 0.4  # cross_host_fraction 0.3
    assert graph.seeds(port=80) == ["http://h0000.web.test/"]
    assert graph.seeds(port=81) == ["http://h0000.web.test:81/"]


def test_features_are_present_and_recorded() -> None:
    graph = small_graph()
    names = set(graph.feature_names())
    assert {"robots_agent_group", "robots_rules", "robots_404", "robots_500", "robots_redirect", "redirect_chain",
            "redirect_loop", "redirect_over_limit", "not_found", "gone", "gzip", "charset", "slow", "huge",
            "retry_after", "trap", "nofollow", "meta_nofollow", "nxdomain", "link_forms", "base_href", "binary",
            "idna", "crawl_delay"} <= names
    agent = graph.role("robots-agent").robots.render().decode()
    assert "User-agent: PeerCrawl" in agent and "Disallow: /*.php$" in agent and "Allow: /private/open.html" in agent
    assert "Crawl-delay: 0.3" in agent and "User-agent: *\nDisallow: /\n" in agent
    assert graph.role("robots-404").robots.status == 404 and graph.role("robots-500").robots.status == 500
    codes, lengths = set(), []
    for url in graph.feature("redirect_chain") + graph.feature("redirect_over_limit"):
        if url.endswith("/0"):
            n, host, path = 0, urlsplit(url).hostname, urlsplit(url).path
            while (res := graph.resource(host, path)) is not None and res.kind == "redirect":
                codes.add(res.status)
                n += 1
                host, path = res.location.host, res.location.path
            lengths.append(n)
    assert codes == {301, 302, 307, 308}
    assert sorted(lengths) == [1, 3, 5, 6]
    zone = graph.zone()
    assert len(zone) == MIN_FEATURE_HOSTS and set(zone.values()) == {"127.0.0.1"}
    assert "xn--bcher-kva.web.test" in zone and graph.nxdomain and not set(graph.nxdomain) & set(zone)
    assert graph.host("BÜCHER.web.test") is graph.host("xn--bcher-kva.web.test") is not None
    trap = graph.resource(graph.role("traps").name, "/trap/a/a/a/a/a/a/")
    assert trap is not None and trap.links[0].path == "/trap/a/a/a/a/a/a/a/"


def test_norm_path_and_idna() -> None:
    assert norm_path("/cs/中文.html") == norm_path("/cs/%e4%b8%ad%E6%96%87.html") == "/cs/%E4%B8%AD%E6%96%87.html"
    assert norm_path("/p/%33.html") == "/p/3.html"
    assert norm_path("/a b?q=%2f") == "/a%20b?q=%2F"
    assert idna_host("Bücher.Web.Test.") == "xn--bcher-kva.web.test"
    assert make_url("h.test", "/", 80) == "http://h.test/" and make_url("h.test", "/x", 81) == "http://h.test:81/x"


def test_robots_spec_matching() -> None:
    spec = RobotsSpec(groups=(
        RobotsGroup(agents=("*",), rules=(Rule(allow=False, pattern="/"),)),
        RobotsGroup(agents=("PeerCrawl",), rules=(
            Rule(allow=False, pattern="/private/"), Rule(allow=True, pattern="/private/open"),
            Rule(allow=False, pattern="/*.php$"), Rule(allow=True, pattern="/tie"), Rule(allow=False, pattern="/tie"),
        ), crawl_delay=0.25),
    ))
    assert spec.allows("peercrawl/1.0 (+x)", "/p/1.html")
    assert not spec.allows("otherbot", "/p/1.html") and spec.allows("otherbot", "/robots.txt")
    assert not spec.allows(UA, "/private/x") and spec.allows(UA, "/private/open.html")
    assert not spec.allows(UA, "/app/index.php") and spec.allows(UA, "/app/index.php?x=1")
    assert spec.allows(UA, "/tie")  # Allow wins a tie of equal length
    assert spec.crawl_delay(UA) == 0.25 and spec.crawl_delay("otherbot") is None
    assert not RobotsSpec(status=503).allows(UA, "/") and RobotsSpec(status=404).allows(UA, "/")


# -- the oracle on a graph small enough to check by hand ---------------------------------------------------


def tiny_graph() -> SiteGraph:
    """a.test (robots rules), b.test (robots 500), c.test (robots 404); pages only through extra links."""
    a, b, c = "a.test", "b.test", "c.test"
    robots_a = RobotsSpec(groups=(
        RobotsGroup(agents=("*",), rules=(Rule(allow=False, pattern="/secret"),)),
        RobotsGroup(agents=("peercrawl",), rules=(Rule(allow=False, pattern="/secret"),
                                                  Rule(allow=True, pattern="/secret/ok.html"))),
    ))
    hosts = (HostSpec(index=0, name=a, display=a, robots=robots_a),
             HostSpec(index=1, name=b, display=b, robots=RobotsSpec(status=500)),
             HostSpec(index=2, name=c, display=c, robots=RobotsSpec(status=404)))

    def page(host: str, path: str, *links: Link, **kw: object) -> Resource:
        return Resource(host=host, path=path, links=links, **kw)  # type: ignore[arg-type]

    def link(host: str, path: str, **kw: object) -> Link:
        return Link(host=host, path=path, href=f"http://{host}{path}", **kw)  # type: ignore[arg-type]

    resources = {(r.host, r.path): r for r in (
        page(a, "/one.html", link(a, "/two.html"), link(c, "/")),
        page(a, "/two.html", link(a, "/one.html"), link(a, "/deep.html")),
        page(a, "/deep.html", link(a, "/hidden.html"), meta_nofollow=True),
        page(a, "/hidden.html"),
        page(a, "/nf.html"),
        page(a, "/secret/s.html"),
        page(a, "/secret/ok.html"),
        Resource(host=a, path="/r/1", kind="redirect", status=301, location=link(a, "/r/2")),
        Resource(host=a, path="/r/2", kind="redirect", status=302, location=link(c, "/final.html")),
        page(c, "/final.html"),
    )}
    root_links = tuple(link(*t) for t in (
        (a, "/one.html"), (a, "/secret/s.html"), (a, "/secret/ok.html"), (b, "/"), ("nx.test", "/"), (a, "/r/1"),
        (a, "/missing.html"), (a, "/a/a/a/a/x.html"), (a, "/pic.png"))) + (link(a, "/nf.html", nofollow=True),)
    return SiteGraph(seed=0, domain="test", hosts=hosts, pages_per_host=1, links_per_page=0, cross_host_fraction=0.0,
                     page_bytes=0, features=False, seed_hosts=1, resources=resources,
                     extra_links={(a, "/"): root_links}, feature_urls={}, nxdomain=("nx.test",), trap_host=None)


def _u(*paths: str) -> frozenset[str]:
    return frozenset(f"http://{p}" for p in paths)


def test_oracle_on_a_hand_checked_graph() -> None:
    e = tiny_graph().expected()
    assert e.fetched == _u("a.test/", "a.test/one.html", "a.test/two.html", "a.test/deep.html", "a.test/secret/ok.html",
                           "a.test/r/1", "a.test/r/2", "c.test/", "c.test/final.html", "a.test/missing.html")
    assert e.statuses["http://a.test/missing.html"] == 404 and e.statuses["http://a.test/r/1"] == 301
    assert e.disallowed == _u("a.test/secret/s.html", "b.test/")
    assert e.refused == _u("a.test/a/a/a/a/x.html", "a.test/pic.png")
    assert e.not_followed == _u("a.test/nf.html", "a.test/hidden.html")
    assert e.unresolvable == _u("nx.test/")
    assert e.over_hop_limit == e.beyond_depth == e.too_large == e.retried == frozenset()
    assert e.robots == _u("a.test/robots.txt", "b.test/robots.txt", "c.test/robots.txt")
    assert e.redirects == {"http://a.test/r/1": "http://a.test/r/2", "http://a.test/r/2": "http://c.test/final.html"}
    assert e.depths["http://c.test/final.html"] == 1 and e.depths["http://c.test/"] == 2
    assert e.depths["http://a.test/deep.html"] == 3
    assert not e.fetched & e.never_requested


def test_oracle_limits_and_options_on_the_hand_checked_graph() -> None:
    g = tiny_graph()
    e = g.expected(max_redirect_hops=1, port=8080)
    assert e.over_hop_limit == frozenset({"http://c.test:8080/final.html"})
    assert "http://a.test:8080/r/2" in e.fetched and "http://c.test:8080/final.html" not in e.fetched
    e = g.expected(max_depth=1)
    assert e.fetched == _u("a.test/", "a.test/one.html", "a.test/secret/ok.html", "a.test/r/1", "a.test/r/2",
                           "c.test/final.html", "a.test/missing.html")
    assert e.beyond_depth == _u("a.test/two.html", "c.test/")
    e = g.expected(user_agent="otherbot/2.0")
    assert "http://a.test/secret/ok.html" in e.disallowed
    e = g.expected(skip_suffixes=(), trap_guard=TrapGuard(max_segment_repeats=4))
    assert e.statuses["http://a.test/pic.png"] == 404 and e.statuses["http://a.test/a/a/a/a/x.html"] == 404
    assert not TrapGuard()("http://a.test/" + "x" * 2100)
    assert not TrapGuard()("http://a.test" + "".join(f"/s{i}" for i in range(65)))
    assert TrapGuard()("http://a.test" + "".join(f"/s{i}" for i in range(64)))


def test_oracle_on_the_feature_web() -> None:
    graph = small_graph()
    e = graph.expected(port=9000)

    def url(role: str, path: str) -> str:
        return make_url(graph.role(role).name, norm_path(path), 9000)

    assert {url("robots-agent", "/private/open.html"), url("robots-agent", "/app/index.php?page=2"),
            url("robots-star", "/docs/public/b.html"), url("robots-star", "/wiki/edit/history"),
            url("robots-404", "/anything/x.html"), url("robots-redirect", "/open/y.html"),
            url("redirects", "/r/final2.html"), url("content", "/from-redirect.html"), url("content", "/gz/only.html"),
            url("charsets", "/cs/镕.html"), url("charsets", "/cs/café.html"), url("timing", "/after-busy.html"),
            url("traps", "/trap/a/a/a/"), url("traps", "/nf/c.html"), url("forms", "/forms/target.html"),
            url("forms", "/other/x.html"), url("content", "/download?id=7")} <= e.fetched
    assert {url("robots-agent", "/private/secret.html"), url("robots-agent", "/app/index.php"),
            url("robots-agent", "/list.html?sort=asc"), url("robots-agent", "/private/secret2.html"),
            url("robots-star", "/tmpl.html"), url("robots-star", "/wiki/edit"), url("robots-500", "/"),
            url("robots-redirect", "/secret/x.html")} <= e.disallowed
    assert e.refused == {url("traps", "/trap/a/a/a/a/"), url("content", "/img/logo.png"),
                         url("content", "/files/paper.pdf")}
    assert e.over_hop_limit == {url("redirects", "/r/final3.html")}
    assert e.not_followed == {url("traps", p) for p in ("/nf/a.html", "/nf/b.html", "/nf/d.html")}
    assert e.unresolvable == {"http://nx-1.web.test:9000/", "http://nx-2.web.test:9000/",
                              "http://nx-2.web.test:9000/x.html"}
    assert e.too_large == {url("timing", "/huge.html")} and url("timing", "/huge.html") in e.fetched
    assert e.retried == {url("timing", "/busy.html"), url("timing", "/maint.html")}
    assert e.statuses[url("content", "/missing.html")] == 404 and e.statuses[url("content", "/gone.html")] == 410
    assert url("robots-redirect", "/robots-real.txt") in e.robots
    assert e.crawl_delays == {graph.role("robots-agent").name: 0.3, graph.role("robots-star").name: 0.2}
    assert "http://xn--bcher-kva.web.test:9000/" in e.fetched
    assert not e.fetched & e.never_requested
    other = graph.expected(user_agent="otherbot", port=9000)
    assert url("robots-star", "/") in other.disallowed  # otherbot's own group: Disallow: /
    assert url("robots-agent", "/") in other.disallowed  # the * group: Disallow: /
    assert url("robots-star", "/docs/public/b.html") not in other.fetched | other.disallowed  # never reached
    assert other.fetched < e.fetched


# -- the server, over real loopback sockets ------------------------------------------------------------


def _charset_of(headers: dict[str, str], body: bytes) -> str:
    m = re.search(r"charset=([\w-]+)", headers.get("content-type", ""))
    if m is None:
        m = re.search(rb"charset=\"?([\w-]+)", body[:1024])
        name = m.group(1).decode() if m else "iso-8859-1"
    else:
        name = m.group(1)
    return "gbk" if name.lower() == "gb2312" else name  # GB2312 is read as its superset GBK


def _links_in(page_url: str, headers: dict[str, str], body: bytes, port: int) -> set[str]:
    """Links of a served page, extracted and normalized here, independently of the generator."""
    doc = lxml.html.fromstring(body.decode(_charset_of(headers, body)))
    base = page_url
    for href in doc.xpath("//base/@href"):
        base = urljoin(page_url, href)
    out = set()
    for href in doc.xpath("//a/@href"):
        parts = urlsplit(urljoin(base, href))
        target = norm_path(parts.path) + (f"?{norm_path(parts.query)}" if parts.query else "")
        out.add(make_url(idna_host(parts.hostname or ""), target, parts.port or port))
    return out


async def test_server_answers_every_oracle_url_as_the_oracle_says(nursery: trio.Nursery) -> None:
    graph = small_graph()
    web = await nursery.start(serve_web, graph)
    e = web.expected(skip_suffixes=())
    assert web.seeds() == [f"http://h0000.web.test:{web.port}/"]
    checked_links = 0
    for url in sorted(e.fetched):
        parts = urlsplit(url)
        res = graph.resource(parts.hostname, norm_path(parts.path) + (f"?{parts.query}" if parts.query else ""))
        if res is not None and res.kind == "huge":
            continue
        status, headers, body = await fetch(web.port, url)
        if url in e.retried:
            assert status in (429, 503) and headers["retry-after"] == "1", url
            status, headers, body = await fetch(web.port, url)
        assert status == e.statuses[url], url
        if status in (301, 302, 307, 308):
            parts = urlsplit(urljoin(url, headers["location"]))
            assert make_url(parts.hostname, parts.path, parts.port) == e.redirects[url]
        if res is not None and res.kind == "html" and status == 200:
            want = {make_url(link.host, link.path, web.port) for link in res.links if not link.scripted}
            assert _links_in(url, headers, body, web.port) == want, url
            checked_links += len(want)
    assert checked_links > 100
    for url in sorted(e.robots):
        status, _, body = await fetch(web.port, url)
        assert status in (200, 301, 404, 500)
    robots_agent = graph.role("robots-agent").name
    status, headers, body = await fetch(web.port, f"http://{robots_agent}/robots.txt")
    assert status == 200 and headers["content-type"].startswith("text/plain") and b"PeerCrawl" in body


async def test_gzip_only_when_accepted_and_httpx_reads_it(nursery: trio.Nursery) -> None:
    graph = small_graph()
    web = await nursery.start(serve_web, graph)
    host = graph.role("content").name
    status, headers, body = await fetch(web.port, f"http://{host}/gz/index.html",
                                        headers=(("Accept-Encoding", "gzip, br"),))
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert b'href="only.html"' in gzip.decompress(body)
    status, headers, body = await fetch(web.port, f"http://{host}/gz/index.html")
    assert "content-encoding" not in headers and b'href="only.html"' in body
    async with httpx.AsyncClient() as client:
        r = await client.get(f"http://127.0.0.1:{web.port}/gz/index.html", headers={"Host": host})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip" and 'href="only.html"' in r.text


async def test_huge_page_streams_and_a_client_that_leaves_does_not_hurt_the_server(nursery: trio.Nursery) -> None:
    graph = small_graph()
    web = await nursery.start(serve_web, graph)
    host = graph.role("timing").name
    client = await RawClient.connect(web.port)
    status, headers, body = await client.get(host, "/huge.html", limit=100_000)
    assert status == 200 and int(headers["content-length"]) == 20 * 2**20 and body.startswith(b"<!DOCTYPE html>")
    await client.aclose()
    with trio.fail_after(10):
        while not any(r.path == "/huge.html" for r in web.log):
            await trio.sleep(0.01)
    record = next(r for r in web.log if r.path == "/huge.html")
    assert 100_000 <= record.bytes_sent < 20 * 2**20
    status, _, _ = await fetch(web.port, f"http://{host}/")
    assert status == 200
    status, headers, body = await fetch(web.port, f"http://{host}/huge.html", method="HEAD")
    assert status == 200 and headers["content-length"] == str(20 * 2**20) and body == b""


async def test_slow_busy_keepalive_and_bad_requests(nursery: trio.Nursery) -> None:
    graph = small_graph()
    web = await nursery.start(serve_web, graph)
    host = graph.role("timing").name
    client = await RawClient.connect(web.port)
    assert (await client.get(host, "/slow.html"))[0] == 200
    status, headers, _ = await client.get(host, "/busy.html")
    assert status == 429 and headers["retry-after"] == "1"
    assert (await client.get(host, "/busy.html"))[0] == 200
    status, headers, _ = await client.get(host, "/maint.html")
    assert status == 503 and headers["retry-after"] == "1"
    await client.aclose()
    slow = next(r for r in web.log if r.path == "/slow.html")
    assert slow.end - slow.start >= 0.3 and slow.user_agent == UA
    assert len({r.conn_id for r in web.log}) == 1  # keep-alive: one connection for all four
    assert (await fetch(web.port, "http://nowhere.web.test/"))[0] == 404
    assert (await fetch(web.port, f"http://{host}/", method="POST"))[0] == 405
    stream = await trio.open_tcp_stream("127.0.0.1", web.port)
    await stream.send_all(b"GARBAGE\r\n\r\n")
    with trio.fail_after(5):
        reply = await stream.receive_some(1024)
    assert reply.startswith(b"HTTP/1.1 400")
    await stream.aclose()
    assert (await fetch(web.port, f"http://{host}/"))[0] == 200  # still serving


# -- the referees ------------------------------------------------------------------------------------


def _rec(host: str, start: float, end: float, conn: int, path: str = "/") -> RequestRecord:
    return RequestRecord(host=host, path=path, status=200, conn_id=conn, start=start, end=end, wall_start=start,
                         wall_end=end, user_agent=UA, bytes_sent=1)


def test_referees_on_synthetic_logs() -> None:
    log = [_rec("a", 0, 1, 1), _rec("a", 1, 2, 1), _rec("a", 2, 3, 2),  # sequential, even across connections
           _rec("b", 0, 2, 3), _rec("b", 1, 3, 4), _rec("b", 1.5, 2.5, 5),  # three at once at t = 1.5
           _rec("c", 0, 5, 6), _rec("c", 1, 2, 6)]  # two requests on one connection count once
    assert max_concurrent_connections_per_host(log) == {"a": 1, "b": 3, "c": 1}
    assert requested_paths(log) == {("a", "/"), ("b", "/"), ("c", "/")}
    assert requested_urls(log, port=81)["http://a:81/"] == 3
    graph = small_graph()
    star = graph.role("robots-star").name  # Crawl-delay 0.2
    polite = [_rec(star, 0, 0.01, 1, "/robots.txt"), _rec(star, 0.02, 0.03, 1), _rec(star, 0.25, 0.3, 1)]
    assert crawl_delay_violations(polite, graph) == []  # robots.txt is left out by default
    assert len(crawl_delay_violations(polite, graph, include_robots=True)) == 1
    rude = polite + [_rec(star, 0.3, 0.31, 1, "/p/1.html")]
    (v,) = crawl_delay_violations(rude, graph)
    assert v.host == star and v.delay == 0.2 and v.gap == pytest.approx(0.05) and v.second.path == "/p/1.html"


async def test_referees_catch_real_impoliteness(nursery: trio.Nursery) -> None:
    graph = small_graph()
    web = await nursery.start(serve_web, graph)
    timing, star = graph.role("timing").name, graph.role("robots-star").name

    async def get(url: str) -> None:
        await fetch(web.port, url)

    async with trio.open_nursery() as inner:  # two connections to one host at once: the slow page
        inner.start_soon(get, f"http://{timing}/slow.html")
        inner.start_soon(get, f"http://{timing}/slow.html")
    for path in ("/", "/p/1.html"):  # back to back, under the 0.2 s Crawl-delay
        await fetch(web.port, f"http://{star}{path}")
    await trio.sleep(0.25)
    await fetch(web.port, f"http://{star}/p/2.html")
    assert max_concurrent_connections_per_host(web.log)[timing] == 2
    assert max_concurrent_connections_per_host(web.log)[star] == 1
    violations = crawl_delay_violations(web.log, graph)
    assert [(v.first.path, v.second.path) for v in violations] == [("/", "/p/1.html")]


# -- the process entry point, the static site and the benchmark web --------------------------------------


@pytest.mark.slow
def test_server_process_prints_its_port_and_logs_json_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "web.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "peerlab.localweb.server", "--seed", "7", "--hosts", "14",
                             "--pages-per-host", "4", "--port", "0", "--log", str(log_file)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        m = re.fullmatch(r"listening 127\.0\.0\.1:(\d+)", line)
        assert m, line
        port = int(m.group(1))
        r = httpx.get(f"http://127.0.0.1:{port}/p/1.html", headers={"Host": "h0003.web.test", "User-Agent": UA})
        assert r.status_code == 200
        for _ in range(500):  # the record is written just after the last byte is sent
            if log_file.exists() and read_log(log_file):
                break
            time.sleep(0.01)
        (record,) = read_log(log_file)
        assert (record.host, record.path, record.status, record.user_agent) == ("h0003.web.test", "/p/1.html", 200, UA)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([sys.executable, "-m", "peerlab.localweb.server", "--seed", "1", "--hosts", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: features=True needs hosts >= 14, got 3"


def test_static_site_holds_the_rendered_pages(tmp_path: Path) -> None:
    graph = SiteGraph.generate(seed=4, hosts=3, pages_per_host=3, links_per_page=5, features=False)
    site = write_site(graph, tmp_path / "site", port=8088)
    for spec in graph.hosts:
        for j in range(3):
            res = graph.resource(spec.name, page_path(j))
            name = "index.html" if j == 0 else f"p/{j}.html"
            assert (site / spec.name / name).read_bytes() == render(graph, res, 8088).body
        assert (site / spec.name / "robots.txt").read_bytes() == spec.robots.render()
    index = site / graph.hosts[0].name / "index.html"
    before = index.stat().st_mtime_ns
    assert write_site(graph, tmp_path / "site", port=8088) == site and index.stat().st_mtime_ns == before  # reused
    write_site(graph, tmp_path / "site", port=8089)  # links carry the port: written again
    pages = b"".join(p.read_bytes() for p in sorted(site.rglob("*.html")))
    assert b":8089/" in pages and b":8088/" not in pages
    with pytest.raises(ValueError, match="features=False"):
        write_site(small_graph(), tmp_path / "other", port=1)


@pytest.mark.slow
@pytest.mark.parametrize("server", ["nginx", "python"])
def test_bench_web_serves_the_graph(tmp_path: Path, server: str) -> None:
    if server == "nginx" and nginx_binary() is None:
        pytest.skip("nginx is not installed")
    with start_bench_web(seed=3, hosts=5, pages_per_host=3, links_per_page=5, page_bytes=3000, server=server,
                         workers=2, directory=tmp_path / "site") as web:
        assert web.kind == server and len(web.base_urls) == 5 and web.zone == web.graph.zone()
        host = web.graph.hosts[2].name
        with httpx.Client() as client:
            for j in range(3):
                r = client.get(f"http://127.0.0.1:{web.port}{page_path(j)}", headers={"Host": host})
                res = web.graph.resource(host, page_path(j))
                assert r.status_code == 200 and r.content == render(web.graph, res, web.port).body
            assert client.get(f"http://127.0.0.1:{web.port}/nope", headers={"Host": host}).status_code == 404
        pids = [p.pid for p in web.processes]
    assert all(p.poll() is not None for p in web.processes) and len(pids) == (1 if server == "nginx" else 2)


def test_a_wide_web_has_the_shape_it_was_asked_for() -> None:
    # the benchmarks' wide web (WIDE_WEB), on fewer hosts and pages
    shape = {k: v for k, v in WIDE_WEB.items() if k not in ("hosts", "pages_per_host", "hosts_per_address")}
    assert WIDE_WEB["hosts"] == 2000 and WIDE_WEB["pages_per_host"] == 50 and WIDE_WEB["hosts_per_address"] == 31
    graph = SiteGraph.generate(seed=4, hosts=200, pages_per_host=20, features=False, **shape)
    pages = [graph._page(spec, j) for spec in graph.hosts for j in range(20)]
    counts = [len(p.links) for p in pages]
    assert min(counts) == 24 and max(counts) == 36
    cross = sum(link.host != p.host for p in pages for link in p.links) / sum(counts)
    assert 0.17 < cross < 0.23
    sizes = sorted(p.size for p in pages)
    median, mean = sizes[len(sizes) // 2], sum(sizes) / len(sizes)
    assert 12_500 < median < 15_500 and 1.1 < mean / median < 1.3
    body = render(graph, pages[7], 8080).body
    assert abs(len(body) - pages[7].size) < 200 or pages[7].size < 2_000  # the page is as long as drawn
    delayed = [h.name for h in graph.hosts if graph.crawl_delay(h.name) == 2.0]
    assert 3 <= len(delayed) <= 20 and graph.crawl_delay(graph.hosts[0].name) is None
    zone = graph.zone(tuple(loopback_address(k) for k in range(7)))  # ceil(200 / 31) addresses
    assert zone[graph.hosts[0].name] == "127.0.0.1" and zone[graph.hosts[7].name] == "127.0.0.1"
    assert zone[graph.hosts[1].name] == "127.0.0.2" and len(set(zone.values())) == 7
    assert max(list(zone.values()).count(a) for a in set(zone.values())) == 29  # about 31 hosts per address
    # the default web is unchanged by the new knobs
    plain = SiteGraph.generate(seed=4, hosts=200, pages_per_host=20, links_per_page=30, features=False)
    assert {len(plain._page(spec, 3).links) for spec in plain.hosts} == {30}
    assert set(plain.zone().values()) == {"127.0.0.1"}
